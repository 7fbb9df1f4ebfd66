"""Fake data in the real formats: ``python -m benchmarks.tools.fake_data --data-root DIR``.

Every real dataset in the layout its loader reads (``benchmarks.data.datasets``), with the real
class lists and a few random images a class, and a randomly initialised ``ViT-B-16-quickgelu``
weight file. With them, ``--fast-dev-run`` walks every real suite on a machine without the data or
the weights (``docs/running.md``). The root is marked with ``FAKE_DATA.json``: checksums are not
checked there and every result computed on it says ``config.fake_data``. So it writes only into a
new folder or one it made: a root that holds any real dataset (a dataset folder the marker does not
list as its own, or ``prepare``'s archives) is refused, and left as it was.

Class lists: CIFAR-100's 100 fine labels, Food-101's 101 dishes and the 37 Oxford-IIIT Pets breeds
as their official metadata lists them; ImageNet's 1000 wnids (``assets/imagenet_wnids.json``);
ImageNet-R's 200 (``assets/imagenet_r_wnids.json``: the 200 indices into the sorted 1000 that
github.com/hendrycks/imagenet-r ``eval.py`` lists), its files named as the shipped RAPF split lists
them (``assets/imagenet_r_split_rapf.txt``).
"""

from __future__ import annotations

import json
import pickle
import sys
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from benchmarks.core.atomic_io import write_json
from benchmarks.core.errors import CommandParser, UserError, one_line_user_errors
from benchmarks.data.datasets import FAKE_DATA_MARKER, rapf_split_list

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
PETS_BREEDS = (
    "Abyssinian american_bulldog american_pit_bull_terrier basset_hound beagle Bengal Birman Bombay boxer "
    "British_Shorthair chihuahua Egyptian_Mau english_cocker_spaniel english_setter german_shorthaired "
    "great_pyrenees havanese japanese_chin keeshond leonberger Maine_Coon miniature_pinscher newfoundland "
    "Persian pomeranian pug Ragdoll Russian_Blue saint_bernard samoyed scottish_terrier shiba_inu Siamese "
    "Sphynx staffordshire_bull_terrier wheaten_terrier yorkshire_terrier"
).split()

#: the folder each dataset's loader reads under the data root (``benchmarks.data.datasets``)
DATASET_FOLDERS = {
    "cifar100": "cifar-100-python",
    "imagenet_r": "imagenet-r",
    "imagenet": "imagenet",
    "pets": "oxford-iiit-pet",
    "food101": "food-101",
}
DATASETS = tuple(DATASET_FOLDERS)
#: what ``python -m benchmarks.prepare`` leaves beside real data: its downloads and its staging folders
PREPARE_TRACES = ("archives", ".prepare-*")
WEIGHTS_FILE = "ViT-B-16-quickgelu-random.safetensors"
#: the marker's ``generator``: the folders of a marker this tool did not write are not its own
GENERATOR = "benchmarks.tools.fake_data"


def _wnids(asset: str) -> list[str]:
    return json.loads((resources.files("benchmarks") / "assets" / asset).read_text(encoding="utf-8"))


def _jpeg(path: Path, rng: np.random.RandomState) -> None:
    """A random RGB JPEG of a random size (real datasets' sizes vary; the transforms resize)."""
    height, width = rng.randint(40, 97, size=2)
    Image.fromarray(rng.randint(0, 256, (height, width, 3), dtype=np.uint8)).save(path, quality=80)


def write_cifar100(root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
    """``cifar-100-python/{train,test,meta}``: the official pickles' keys, 32x32 random images."""
    base = root / DATASET_FOLDERS["cifar100"]
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


def write_imagenet_r(root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
    """``imagenet-r/<wnid>/*.jpg`` for the 200 ImageNet-R wnids, named as the shipped RAPF split
    lists them: each class's first ``n_train`` train and ``n_test`` test files, so that both the
    list (``split = "rapf"``) and the stratified split walk."""
    base = root / DATASET_FOLDERS["imagenet_r"]
    lists = rapf_split_list()
    for wnid in _wnids("imagenet_r_wnids.json"):
        (base / wnid).mkdir(parents=True, exist_ok=True)
    for part, count in (("train", n_train), ("test", n_test)):
        taken: dict[str, int] = {}
        for path in lists[part]:
            wnid = path.split("/")[0]
            if taken.get(wnid, 0) < count:
                taken[wnid] = taken.get(wnid, 0) + 1
                _jpeg(base / path, rng)
    return base


def write_imagenet(root: Path, n_train: int, n_val: int, rng: np.random.RandomState) -> Path:
    """``imagenet/{train,val}/<wnid>/*.JPEG`` for all 1000 wnids (as ``prepare imagenet`` leaves them)."""
    base = root / DATASET_FOLDERS["imagenet"]
    for wnid in tqdm(_wnids("imagenet_wnids.json"), desc="fake imagenet", leave=False):
        for split, count in (("train", n_train), ("val", n_val)):
            (base / split / wnid).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                _jpeg(base / split / wnid / f"{wnid}_{i}.JPEG", rng)
    return base


def write_pets(root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
    """``oxford-iiit-pet/{images,annotations}``: ``<Breed>_<n>.jpg`` and the split lists."""
    base = root / DATASET_FOLDERS["pets"]
    (base / "images").mkdir(parents=True, exist_ok=True)
    (base / "annotations").mkdir(parents=True, exist_ok=True)
    for split, count, offset in (("trainval", n_train, 0), ("test", n_test, n_train)):
        lines = []
        for label, breed in enumerate(PETS_BREEDS, start=1):
            species = 1 if breed[0].isupper() else 2  # the official convention: cats are capitalised
            for i in range(offset + 1, offset + count + 1):
                _jpeg(base / "images" / f"{breed}_{i}.jpg", rng)
                lines.append(f"{breed}_{i} {label} {species} {label}")
        (base / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return base


def write_food101(root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
    """``food-101/{images/<dish>/*.jpg, meta/{train,test}.json}``."""
    base = root / DATASET_FOLDERS["food101"]
    (base / "meta").mkdir(parents=True, exist_ok=True)
    splits: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    for dish in FOOD101_CLASSES:
        (base / "images" / dish).mkdir(parents=True, exist_ok=True)
        for split, count, offset in (("train", n_train, 0), ("test", n_test, n_train)):
            names = [f"{dish}/{100000 + i}" for i in range(offset, offset + count)]
            for name in names:
                _jpeg(base / "images" / f"{name}.jpg", rng)
            splits[split][dish] = names
    for split, listing in splits.items():
        (base / "meta" / f"{split}.json").write_text(json.dumps(listing))
    (base / "meta" / "classes.txt").write_text("\n".join(FOOD101_CLASSES) + "\n")
    return base


def write_random_weights(path: Path, seed: int = 0, model: str = "ViT-B-16-quickgelu") -> Path:
    """A randomly initialised open_clip ``model`` as safetensors (fp16, as OpenAI ships its weights)."""
    import open_clip
    import torch

    from benchmarks.backbone.loading import quiet_root_logger
    from benchmarks.core.atomic_io import write_tensors

    torch.manual_seed(seed)
    with quiet_root_logger():  # open_clip warns that a random init is random
        clip = open_clip.create_model(model, pretrained=None)
    write_tensors(path, {k: v.detach().half().contiguous() for k, v in clip.state_dict().items()})
    return path


def _own_folders(root: Path) -> set[str]:
    """The dataset folders that ``root``'s marker lists as written (or being written) by this tool;
    none where there is no marker, or one this tool did not write."""
    try:
        record = json.loads((root / FAKE_DATA_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(record, dict) or record.get("generator") != GENERATOR:
        return set()
    listed = record.get("datasets")
    return {str(folder) for folder in listed.values()} if isinstance(listed, dict) else set()


def real_data_in(root: Path) -> list[str]:
    """What under ``root`` is not fake data of this tool: every dataset folder it can write that the
    marker does not list as its own, whichever datasets are asked for now, and ``prepare``'s traces."""
    own = _own_folders(root)
    found = [
        f"{folder}/" for folder in DATASET_FOLDERS.values() if (root / folder).exists() and folder not in own
    ]
    for pattern in PREPARE_TRACES:
        found += sorted(f"{path.name}/" for path in root.glob(pattern))
    return found


def make_fake_data(
    root: Path,
    datasets: tuple[str, ...] = DATASETS,
    train_per_class: int = 2,
    test_per_class: int = 1,
    seed: int = 0,
    weights: bool = True,
) -> dict:
    """Write the fake datasets and weights under ``root``; returns what ``FAKE_DATA.json`` records.
    A root that holds real data (``real_data_in``) is refused with a ``UserError`` before anything
    is written."""
    if real := real_data_in(root):  # checked before anything is written: a refusal changes nothing
        raise UserError(
            f"{root} holds real data ({', '.join(real)}), and its checksums would go unchecked beside "
            f"fake data marked {FAKE_DATA_MARKER}; choose another --data-root (a new folder)"
        )
    rng = np.random.RandomState(seed)
    writers = {
        "cifar100": lambda: write_cifar100(root, train_per_class, test_per_class, rng),
        "imagenet_r": lambda: write_imagenet_r(root, train_per_class, test_per_class, rng),
        "imagenet": lambda: write_imagenet(root, train_per_class, test_per_class, rng),
        "pets": lambda: write_pets(root, train_per_class, test_per_class, rng),
        "food101": lambda: write_food101(root, train_per_class, test_per_class, rng),
    }
    root.mkdir(parents=True, exist_ok=True)
    # Written first, listing what is about to be written besides what an earlier call wrote: a killed
    # generation leaves a folder that a rerun recognises as its own and completes.
    earlier = {
        name: DATASET_FOLDERS[name] for name in DATASETS if DATASET_FOLDERS[name] in _own_folders(root)
    }
    planned = {**earlier, **{name: DATASET_FOLDERS[name] for name in datasets}}
    record = {"generator": GENERATOR, "seed": seed, "datasets": planned}
    write_json(root / FAKE_DATA_MARKER, record)
    for name in tqdm(datasets, desc="fake data"):
        writers[name]()
    record.update(train_per_class=train_per_class, test_per_class=test_per_class)
    if weights:
        record["weights"] = str(write_random_weights(root / WEIGHTS_FILE, seed))
    write_json(root / FAKE_DATA_MARKER, record)
    return record


@one_line_user_errors
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.tools.fake_data", description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", required=True, help="where to write (a new or a fake-data folder)")
    parser.add_argument(
        "--datasets", default=",".join(DATASETS), help=f"comma-separated subset of {', '.join(DATASETS)}"
    )
    parser.add_argument("--train-per-class", type=int, default=2)
    parser.add_argument("--test-per-class", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-weights", action="store_true", help="skip the random ViT-B/16 weight file")
    args = parser.parse_args(argv)
    datasets = tuple(dict.fromkeys(d for d in args.datasets.split(",") if d))
    unknown = sorted(set(datasets) - set(DATASETS))
    if unknown:
        raise UserError(f"unknown dataset {unknown[0]!r}; valid: {', '.join(DATASETS)}")
    if not datasets:
        raise UserError(f"--datasets names no dataset; give some of {', '.join(DATASETS)}")
    if args.train_per_class < 1 or args.test_per_class < 1:
        raise UserError("--train-per-class and --test-per-class must be at least 1")
    root = Path(args.data_root).expanduser()
    try:
        record = make_fake_data(
            root, datasets, args.train_per_class, args.test_per_class, args.seed, weights=not args.no_weights
        )
    except OSError as err:  # a full disk, a folder one may not write, a root under a file
        where = f" ({err.filename})" if err.filename else ""
        raise UserError(
            f"cannot write the fake data{where}: {err.strerror}; choose another --data-root"
        ) from None
    weights = f" --weights {record['weights']}" if "weights" in record else ""
    print(
        f"fake data in {root}; walk a real suite on it with:\n"
        f"  python -m benchmarks.run --suite main --fast-dev-run --data-root {root}{weights}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
