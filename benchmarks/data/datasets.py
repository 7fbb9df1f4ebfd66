"""Dataset loaders: every dataset of the protocol as raw ``(PIL RGB image, int label)`` pairs.

No transform is applied here (the stream builder adds them) and nothing is ever downloaded: a
missing folder raises ``DataNotFoundError`` naming the path looked at and how to provide it.
Label lists are read from metadata or folder listings, never by decoding images, because
class-incremental splitting needs them up front.

Expected layouts under ``data_root``::

    cifar-100-python/{train,test,meta}             cifar100 (official python version)
    imagenet-r/<wnid>/*.jpg                        imagenet_r (200 wnid folders)
    imagenet/{train,val}/<wnid>/*.JPEG             imagenet100, imagenet1k
    oxford-iiit-pet/{annotations/test.txt,images/} pets
    food-101/{meta/test.json,images/}              food101
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision.datasets import CIFAR100, Food101, OxfordIIITPet
from torchvision.datasets.folder import (
    IMG_EXTENSIONS,
    default_loader,
    find_classes,
    make_dataset,
)

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.synthetic import world

_ROOT_HINT = "or pass --data-root DIR"
#: written at the root of a data folder by ``python -m benchmarks.tools.fake_data``: its files are
#: not the official ones, so checksums are not checked there, and the runner marks every result
#: computed on it (``config.fake_data``)
FAKE_DATA_MARKER = "FAKE_DATA.json"


def is_fake_data_root(data_root: str | Path | None) -> bool:
    return data_root is not None and (Path(data_root).expanduser() / FAKE_DATA_MARKER).is_file()


def _with_prepare_hint(target: str, root: Path, manual: str) -> str:
    """How to fix a missing dataset: the ``prepare`` command, or by hand, or another root."""
    option = "" if str(root) == "data" else f" --data-root {root}"
    return f"run python -m benchmarks.prepare {target}{option} ({manual}) {_ROOT_HINT}"


@dataclass
class ClassificationData:
    """A labelled dataset; ``train`` is None for zero-shot-only targets."""

    name: str
    train: Dataset | None
    test: Dataset
    class_names: list[str]
    train_targets: list[int] | None
    test_targets: list[int]

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def subset(self, train: list[int] | None = None, test: list[int] | None = None) -> ClassificationData:
        """The same classes, with only the train and test images at these indices (None: all)."""
        train_set, train_targets = self.train, self.train_targets
        if train is not None and train_set is not None and train_targets is not None:
            train_set, train_targets = Subset(train_set, train), [train_targets[i] for i in train]
        test_set, test_targets = self.test, self.test_targets
        if test is not None:
            test_set, test_targets = Subset(test_set, test), [test_targets[i] for i in test]
        return ClassificationData(
            self.name, train_set, test_set, self.class_names, train_targets, test_targets
        )


class FileListDataset(Dataset):
    """Images listed as ``(path, label)`` pairs, opened lazily as RGB PIL images."""

    def __init__(self, samples: list[tuple[str, int]], loader: Callable[[str], Any] = default_loader) -> None:
        self.samples = samples
        self.targets = [label for _, label in samples]
        self.loader = loader

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.samples[index]
        return self.loader(path), label


def clean_class_name(name: str) -> str:
    """Underscores to spaces, surrounding whitespace removed."""
    return name.replace("_", " ").strip()


@functools.lru_cache(maxsize=1)
def imagenet_wnid_names() -> dict[str, str]:
    """Map of the 1000 ImageNet-1K wnids, in their official sorted order, to the CLIP-style class
    names that open_clip ships in that order (``open_clip.zero_shot_metadata.IMAGENET_CLASSNAMES``).
    Only the wnids are kept here, as data (``assets/imagenet_wnids.json``)."""
    asset = resources.files("benchmarks") / "assets" / "imagenet_wnids.json"
    wnids = json.loads(asset.read_text(encoding="utf-8"))
    return dict(zip(wnids, IMAGENET_CLASSNAMES, strict=True))


def wnid_class_names(wnids: list[str]) -> list[str]:
    """Readable names for wnid folders; a wnid outside ImageNet-1K keeps its folder name."""
    names = imagenet_wnid_names()
    return [names.get(wnid, clean_class_name(wnid)) for wnid in wnids]


def _require_root(data_root: Path | None, dataset: str) -> Path:
    if data_root is None:
        raise UserError(f"dataset '{dataset}' needs a data root: pass --data-root DIR")
    return Path(data_root).expanduser()


def _check_choice(dataset: str, option: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise UserError(f"{dataset} option {option}={value!r} is not one of {', '.join(valid)}")


def _check_type(dataset: str, option: str, value: Any, kinds: tuple[type, ...], what: str) -> None:
    """A suite's dataset option of the wrong type (``split_file = 5``): one line, not a traceback
    from deep inside the loader. ``bool`` is never a number here, although Python counts it as one."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise UserError(f"{dataset} option {option} must be {what}, not {value!r}")


def _require(path: Path, what: str, how: str, is_dir: bool = False) -> None:
    """Raise a one-line ``DataNotFoundError`` unless ``path`` exists (as a folder if ``is_dir``)."""
    if not (path.is_dir() if is_dir else path.is_file()):
        raise DataNotFoundError(f"{what} not found: looked for {path}; {how}")


def _scan_folder(directory: Path, class_to_idx: dict[str, int], what: str, how: str) -> list[tuple[str, int]]:
    """``make_dataset`` with its multi-line errors turned into one-line ``DataNotFoundError``."""
    try:
        return make_dataset(str(directory), class_to_idx, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as error:
        reason = " ".join(str(error).split())
        raise DataNotFoundError(f"{what}: {reason} (looked in {directory}); {how}") from None


def _class_folders(directory: Path, what: str, how: str) -> list[str]:
    _require(directory, what, how, is_dir=True)
    try:
        return find_classes(str(directory))[0]
    except FileNotFoundError:
        raise DataNotFoundError(f"{what}: no class folders found in {directory}; {how}") from None


# --- CIFAR-100 --------------------------------------------------------------------------------


class _UncheckedCIFAR100(CIFAR100):
    """torchvision's CIFAR100 that only checks the files exist (``check_integrity`` skips md5=None)."""

    train_list = [[name, None] for name, _ in CIFAR100.train_list]
    test_list = [[name, None] for name, _ in CIFAR100.test_list]
    meta = {**CIFAR100.meta, "md5": None}


def load_cifar100(
    data_root: Path | None, verify_checksum: bool = True, class_names: str = "clean"
) -> ClassificationData:
    """CIFAR-100, official 50k/10k split, from ``{data_root}/cifar-100-python``.

    ``verify_checksum=False`` skips torchvision's MD5 check (for re-packed copies and fixtures).
    ``class_names``: ``"clean"`` (underscores become spaces) or ``"torchvision"`` (torchvision's
    names as they are, ``aquarium_fish``: what Continual-CLIP and MG-CLIP put in their prompts).
    """
    _check_choice("cifar100", "class_names", class_names, ("clean", "torchvision"))
    root = _require_root(data_root, "cifar100")
    how = _with_prepare_hint("cifar100", root, f"or extract the official cifar-100-python.tar.gz into {root}")
    for name in ("train", "test", "meta"):
        _require(root / CIFAR100.base_folder / name, "CIFAR-100", how)
    cls = CIFAR100 if verify_checksum and not is_fake_data_root(root) else _UncheckedCIFAR100
    try:
        train, test = cls(str(root), train=True, download=False), cls(str(root), train=False, download=False)
    except RuntimeError:
        raise UserError(
            f"CIFAR-100 files in {root / CIFAR100.base_folder} fail torchvision's MD5 check; prepare them "
            f"again with python -m benchmarks.prepare cifar100 --force --data-root {root} "
            "(or pass verify_checksum=False for a re-packed copy)"
        ) from None
    return ClassificationData(
        name="cifar100",
        train=train,
        test=test,
        class_names=[c if class_names == "torchvision" else clean_class_name(c) for c in train.classes],
        train_targets=[int(t) for t in train.targets],
        test_targets=[int(t) for t in test.targets],
    )


# --- ImageNet-R ---------------------------------------------------------------------------------


def _n_train(n_images: int, fraction: float) -> int:
    """Rounded ``fraction * n`` train images, leaving at least one test image when ``n >= 2``."""
    n_train = int(np.floor(fraction * n_images + 0.5))
    return min(max(n_train, 1), n_images - 1) if n_images >= 2 else n_images


def stratified_split(
    samples: list[tuple[str, int]], fraction: float = 0.8, seed: int = 0
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Per class: sort paths, shuffle with ``RandomState(seed)``, first ``fraction`` to train.

    Each class gets its own ``RandomState(seed)`` so its split depends on its own files only.
    """
    by_class: dict[int, list[str]] = {}
    for path, label in samples:
        by_class.setdefault(label, []).append(path)
    train: list[tuple[str, int]] = []
    test: list[tuple[str, int]] = []
    for label in sorted(by_class):
        paths = sorted(by_class[label])
        order = np.random.RandomState(seed).permutation(len(paths))
        n_train = _n_train(len(paths), fraction)
        train += [(paths[i], label) for i in order[:n_train]]
        test += [(paths[i], label) for i in order[n_train:]]
    return train, test


#: RAPF's ImageNet-R split list (linlany/RAPF, imgr_split/imgr_train_test_split.txt, commit 81d41df),
#: the list MG-CLIP's README points to: 24,000 train and 6,000 test paths ``<wnid>/<file>``, one per
#: line under a "train" and a "test" line. Shipped without its one stray entry
#: (``n02437616/test_img_R.py``, not an image). docs/baselines.md §3.
RAPF_SPLIT = "imagenet_r_split_rapf.txt"
IMAGENET_R_SPLITS = ("rapf", "stratified")


def read_split_list(text: str, source: str) -> dict[str, list[str]]:
    """Train and test paths of a split list: JSON ``{"train": [...], "test": [...]}``, or RAPF's text
    format (a "train" line, its paths, a "test" line, its paths). Entries that are not images (by
    torchvision's ``IMG_EXTENSIONS``) are dropped, as a folder scan would drop them."""
    try:
        spec = json.loads(text)
        lists = {part: [str(p) for p in spec[part]] for part in ("train", "test")}
    except json.JSONDecodeError:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if "train" not in lines or "test" not in lines or lines.index("train") > lines.index("test"):
            raise UserError(
                f'split file {source} is neither JSON {{"train": [paths], "test": [paths]}} nor a list '
                'with a "train" line and a "test" line before their paths'
            ) from None
        cut = lines.index("test")
        lists = {"train": lines[lines.index("train") + 1 : cut], "test": lines[cut + 1 :]}
    except (KeyError, TypeError):
        raise UserError(f'split file {source} must be JSON {{"train": [paths], "test": [paths]}}') from None
    images = {part: [p for p in paths if p.lower().endswith(IMG_EXTENSIONS)] for part, paths in lists.items()}
    for part, paths in images.items():
        if not paths:  # a run would learn, or be evaluated on, nothing
            dropped = " (none of its entries is an image path)" if lists[part] else ""
            raise UserError(
                f"split file {source} lists no {part} images{dropped}; give image paths relative to "
                "the dataset folder, e.g. n01443537/art_0.jpg"
            )
    return images


def rapf_split_list() -> dict[str, list[str]]:
    """The shipped RAPF ImageNet-R split (``RAPF_SPLIT``)."""
    asset = resources.files("benchmarks") / "assets" / RAPF_SPLIT
    return read_split_list(asset.read_text(encoding="utf-8"), f"benchmarks/assets/{RAPF_SPLIT}")


def _split_from_lists(
    samples: list[tuple[str, int]], folder: Path, lists: dict[str, list[str]], source: str, partial: bool
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Train/test samples from path lists relative to ``folder``. ``partial``: listed images absent
    from ``folder`` are skipped (fake data holds a few of each class), instead of an error."""
    label_of = {Path(path).relative_to(folder).as_posix(): label for path, label in samples}
    prefix = folder.name + "/"
    parts: dict[str, list[tuple[str, int]]] = {}
    for part, paths in lists.items():
        # Public split lists often keep the dataset folder as first component; accept both forms.
        relative = [
            p[len(prefix) :] if p.startswith(prefix) else p for p in (q.replace("\\", "/") for q in paths)
        ]
        missing = [p for p in relative if p not in label_of]
        if missing and not partial:
            raise DataNotFoundError(
                f"split {source} lists {len(missing)} {part} image(s) not found under {folder}, "
                f"e.g. {folder / missing[0]}; prepare ImageNet-R again "
                f"(python -m benchmarks.prepare imagenet_r --force) or fix the split file {_ROOT_HINT}"
            )
        parts[part] = [(str(folder / p), label_of[p]) for p in relative if p in label_of]
    overlap = {p for p, _ in parts["train"]} & {p for p, _ in parts["test"]}
    if overlap:
        raise UserError(
            f"split {source} puts {len(overlap)} image(s) in both train and test, e.g. {min(overlap)}"
        )
    return parts["train"], parts["test"]


@functools.lru_cache(maxsize=1)
def mg_clip_imagenet_r_names() -> dict[str, str]:
    """MG-CLIP's ImageNet-R class names by wnid (``assets/imagenet_r_names_mg_clip.json``: its
    ``dataset_reqs/imagenet_R_classes.txt``, kept as written, underscores included)."""
    asset_file = resources.files("benchmarks") / "assets" / "imagenet_r_names_mg_clip.json"
    asset = json.loads(asset_file.read_text(encoding="utf-8"))
    return dict(zip(asset["wnids"], asset["names"], strict=True))


def load_imagenet_r(
    data_root: Path | None,
    split: str = "rapf",
    split_seed: int = 0,
    train_fraction: float = 0.8,
    split_file: str | Path | None = None,
    class_names: str = "openai",
) -> ClassificationData:
    """ImageNet-R from ``{data_root}/imagenet-r/<wnid>/``.

    ``split``: ``"rapf"``, the published list MG-CLIP uses (``RAPF_SPLIT``, docs/decisions.md P1),
    or ``"stratified"``, a per-class ``train_fraction`` split drawn with ``split_seed``.
    ``split_file``: a list of one's own (JSON or RAPF's text format), used instead of ``split``.
    ``class_names``: ``"openai"`` (CLIP's ImageNet names) or ``"mg_clip"`` (MG-CLIP's list).
    """
    _check_choice("imagenet_r", "split", split, IMAGENET_R_SPLITS)
    _check_choice("imagenet_r", "class_names", class_names, ("openai", "mg_clip"))
    root = _require_root(data_root, "imagenet_r")
    _check_type("imagenet_r", "split_seed", split_seed, (int,), "an integer")
    _check_type("imagenet_r", "train_fraction", train_fraction, (int, float), "a number")
    if split_file is not None:
        _check_type("imagenet_r", "split_file", split_file, (str, Path), "the path of a split list")
    if not 0.0 < train_fraction < 1.0:
        raise UserError(f"train_fraction must be between 0 and 1, got {train_fraction}")
    if not 0 <= split_seed < 2**32:  # numpy's RandomState takes no other seed
        raise UserError(f"imagenet_r option split_seed must be between 0 and {2**32 - 1}, got {split_seed}")
    folder = root / "imagenet-r"
    how = _with_prepare_hint("imagenet_r", root, f"or extract imagenet-r.tar into {root}")
    wnids = _class_folders(folder, "ImageNet-R", how)
    samples = _scan_folder(folder, {w: i for i, w in enumerate(wnids)}, "ImageNet-R", how)
    if split_file is not None:
        path = Path(split_file).expanduser()
        _require(path, "ImageNet-R split file", "give an existing split list (JSON or RAPF's text format)")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise UserError(
                f"split file {path} is not UTF-8 text (a bad byte at offset {err.start}); save it as "
                "UTF-8 (JSON or RAPF's text format)"
            ) from None
        lists = read_split_list(text, str(path))
        train, test = _split_from_lists(samples, folder, lists, f"file {path}", partial=False)
    elif split == "rapf":
        # fake data (benchmarks.tools.fake_data) holds a few of the listed images of each class
        train, test = _split_from_lists(samples, folder, rapf_split_list(), "rapf", is_fake_data_root(root))
    else:
        train, test = stratified_split(samples, train_fraction, split_seed)
    data = _folder_data("imagenet_r", wnids, train, test)
    if class_names == "mg_clip":
        names = mg_clip_imagenet_r_names()
        data.class_names = [names.get(wnid, name) for wnid, name in zip(wnids, data.class_names)]
    return data


# --- ImageNet-100 / ImageNet-1K -----------------------------------------------------------------


def _load_imagenet(
    name: str, data_root: Path | None, n_classes: int, include_train: bool = True
) -> ClassificationData:
    """ImageNet's train and val folders, restricted to the first ``n_classes`` of the 1000 sorted
    ImageNet-1K wnids. Every one of them must be there: a partial copy never passes for the full
    dataset. ``include_train=False`` reads only val (a zero-shot target never scans 1.28M files)."""
    root = _require_root(data_root, name)
    train_dir, val_dir = root / "imagenet" / "train", root / "imagenet" / "val"
    how = _with_prepare_hint(
        "imagenet", root, f"from your ILSVRC2012 archives, into {root / 'imagenet'}/{{train,val}}/<wnid>/"
    )
    wnids = sorted(imagenet_wnid_names())[:n_classes]
    scanned = [val_dir] + ([train_dir] if include_train else [])
    for directory in scanned:
        found = set(_class_folders(directory, f"ImageNet {directory.name}", how))
        missing = [w for w in wnids if w not in found]
        if missing:
            sort_hint = " (sort the val images into one folder per wnid)" if directory == val_dir else ""
            raise DataNotFoundError(
                f"{name} needs the {len(wnids)} ImageNet wnid folders {wnids[0]}..{wnids[-1]} "
                f"in {directory}, "
                f"but {len(missing)} are missing, e.g. {directory / missing[0]}{sort_hint}; {how}"
            )
    class_to_idx = {w: i for i, w in enumerate(wnids)}
    test = _scan_folder(val_dir, class_to_idx, "ImageNet val", how)
    train = _scan_folder(train_dir, class_to_idx, "ImageNet train", how) if include_train else None
    return _folder_data(name, wnids, train, test)


def load_imagenet100(
    data_root: Path | None, n_classes: int = 100, include_train: bool = True
) -> ClassificationData:
    """ImageNet-100: the first ``n_classes`` sorted ImageNet-1K wnids; ImageNet val as test."""
    if not 1 <= n_classes <= 1000:
        raise UserError(f"imagenet100 option n_classes={n_classes} must be between 1 and 1000")
    return _load_imagenet("imagenet100", data_root, n_classes, include_train)


def load_imagenet1k(data_root: Path | None, include_train: bool = True) -> ClassificationData:
    """ImageNet-1K: all 1000 wnid folders of ImageNet train; ImageNet val as test."""
    return _load_imagenet("imagenet1k", data_root, 1000, include_train)


def _folder_data(
    name: str, wnids: list[str], train: list[tuple[str, int]] | None, test: list[tuple[str, int]]
) -> ClassificationData:
    train_set = FileListDataset(train) if train is not None else None
    test_set = FileListDataset(test)
    return ClassificationData(
        name=name,
        train=train_set,
        test=test_set,
        class_names=wnid_class_names(wnids),
        train_targets=list(train_set.targets) if train_set is not None else None,
        test_targets=list(test_set.targets),
    )


# --- zero-shot targets --------------------------------------------------------------------------


def _torchvision_target(
    name: str,
    title: str,
    root: Path,
    base: Path,
    split_file: str,
    extract: str,
    split: Callable[[str], Dataset],
    train_split: str,
    include_train: bool,
) -> ClassificationData:
    """A zero-shot target that torchvision reads from ``base`` under ``root``: its ``split_file``
    and ``images`` folder must be there (else one line that says how: ``extract`` by hand, or
    ``prepare``); ``split(s)`` builds split ``s``. The test split, and ``train_split`` if
    ``include_train``."""
    how = _with_prepare_hint(name, root, f"or extract {extract}")
    _require(base / split_file, title, how)
    _require(base / "images", title, how, is_dir=True)
    test = split("test")
    train = split(train_split) if include_train else None
    return ClassificationData(
        name=name,
        train=train,
        test=test,
        class_names=[clean_class_name(c) for c in test.classes],
        # torchvision keeps the labels only in this private list (read from the annotation files).
        train_targets=list(train._labels) if train is not None else None,
        test_targets=list(test._labels),
    )


def load_pets(data_root: Path | None, include_train: bool = False) -> ClassificationData:
    """Oxford-IIIT Pets test split (37 breeds); ``include_train`` adds the trainval split."""
    root = _require_root(data_root, "pets")
    base = root / "oxford-iiit-pet"
    return _torchvision_target(
        "pets",
        "Oxford-IIIT Pets",
        root,
        base,
        "annotations/test.txt",
        f"the official images.tar.gz and annotations.tar.gz into {base}",
        lambda split: OxfordIIITPet(str(root), split=split, target_types="category", download=False),
        train_split="trainval",
        include_train=include_train,
    )


def load_food101(data_root: Path | None, include_train: bool = False) -> ClassificationData:
    """Food-101 test split (101 dishes); ``include_train`` adds the train split."""
    root = _require_root(data_root, "food101")
    return _torchvision_target(
        "food101",
        "Food-101",
        root,
        root / "food-101",
        "meta/test.json",
        f"the official food-101.tar.gz into {root}",
        lambda split: Food101(str(root), split=split, download=False),
        train_split="train",
        include_train=include_train,
    )


def load_synthetic(
    data_root: Path | None = None,
    n_train_per_class: int = 100,
    n_test_per_class: int = 20,
    seed: int = 0,
    n_classes: int = 100,
    domain: str = "photo",
) -> ClassificationData:
    """The offline synthetic dataset (``benchmarks.miniature``) in ``domain`` ("photo", the tiny
    CLIP's pretraining domain, or "faded", the shifted CIL domain); ``data_root`` is ignored."""
    train, test, class_names = world.make_splits(n_train_per_class, n_test_per_class, seed, n_classes, domain)
    return ClassificationData(
        name="synthetic",
        train=train,
        test=test,
        class_names=class_names,
        train_targets=list(train.targets),
        test_targets=list(test.targets),
    )


DATASETS: dict[str, Callable[..., ClassificationData]] = {
    "cifar100": load_cifar100,
    "imagenet_r": load_imagenet_r,
    "imagenet100": load_imagenet100,
    "imagenet1k": load_imagenet1k,
    "pets": load_pets,
    "food101": load_food101,
    "synthetic": load_synthetic,
}


def load_zero_shot_target(name: str, data_root: str | Path | None = None) -> ClassificationData:
    """A zero-shot target: only its test split is read where the loader can skip the rest."""
    accepts_train_flag = "include_train" in inspect.signature(DATASETS.get(name, load_dataset)).parameters
    return load_dataset(name, data_root, **({"include_train": False} if accepts_train_flag else {}))


class TransformedDataset(Dataset):
    """``(transform(image), label)`` pairs of a dataset of ``(image, label)``; picklable, so the
    transform runs in DataLoader workers under every start method (fork, forkserver, spawn)."""

    def __init__(self, dataset: Dataset, transform: Callable[[Any], Any]) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.dataset[index]
        return self.transform(image), int(label)


def load_dataset(name: str, data_root: str | Path | None = None, **options: Any) -> ClassificationData:
    """Load dataset ``name`` from ``data_root``; ``options`` go to its loader (checked by name)."""
    if name not in DATASETS:
        raise UserError(f"unknown dataset '{name}'; valid: {', '.join(DATASETS)}")
    loader = DATASETS[name]
    root = Path(data_root) if data_root is not None else None
    try:
        inspect.signature(loader).bind(root, **options)
    except TypeError:
        valid = [p for p in inspect.signature(loader).parameters if p != "data_root"]
        raise UserError(
            f"dataset '{name}' does not take option(s) {', '.join(sorted(set(options) - set(valid)))}; "
            f"valid: {', '.join(valid) or 'none'}"
        ) from None
    return loader(root, **options)
