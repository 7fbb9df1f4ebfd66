"""What every dataset loader shares, and ``load_dataset``: datasets as raw ``(PIL RGB image, int
label)`` pairs.

Each dataset is a unit of ``benchmarks/data/units/`` (``benchmarks.data.unit``): its folder under
the data root, its loader, its files and class names live there; this module holds what their
loaders share. No transform is applied here (the stream builder adds them) and nothing is ever
downloaded: a missing folder raises ``DataNotFoundError`` naming the path looked at and how to
provide it. Label lists are read from metadata or folder listings, never by decoding images,
because class-incremental splitting needs them up front.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.unit import DatasetUnit, dataset_unit

if TYPE_CHECKING:  # torch is imported where images are built (benchmarks.data.image_lists)
    from torch.utils.data import Dataset

ROOT_HINT = "or pass --data-root DIR"
#: written at the root of a data folder by ``python -m benchmarks.tools.fake_data``: its files are
#: not the official ones, so checksums are not checked there, and the runner marks every result
#: computed on it (``config.fake_data``)
FAKE_DATA_MARKER = "FAKE_DATA.json"
# torchvision and open_clip are imported where they are used: every dataset unit imports this module,
# and ``prepare`` or ``--help`` must not wait seconds for them.


def image_extensions() -> tuple[str, ...]:
    """The file endings torchvision's folder datasets read as images (``IMG_EXTENSIONS``)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return IMG_EXTENSIONS


def is_fake_data_root(data_root: str | Path | None) -> bool:
    return data_root is not None and (Path(data_root).expanduser() / FAKE_DATA_MARKER).is_file()


def with_prepare_hint(target: str, root: Path, manual: str) -> str:
    """How to fix a missing dataset: the ``prepare`` command, or by hand, or another root."""
    option = "" if str(root) == "data" else f" --data-root {root}"
    return f"run python -m benchmarks.prepare {target}{option} ({manual}) {ROOT_HINT}"


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
        from torch.utils.data import Subset

        train_set, train_targets = self.train, self.train_targets
        if train is not None and train_set is not None and train_targets is not None:
            train_set, train_targets = Subset(train_set, train), [train_targets[i] for i in train]
        test_set, test_targets = self.test, self.test_targets
        if test is not None:
            test_set, test_targets = Subset(test_set, test), [test_targets[i] for i in test]
        return ClassificationData(
            self.name, train_set, test_set, self.class_names, train_targets, test_targets
        )


def clean_class_name(name: str) -> str:
    """Underscores to spaces, surrounding whitespace removed."""
    return name.replace("_", " ").strip()


@functools.lru_cache(maxsize=1)
def imagenet_wnid_names() -> dict[str, str]:
    """Map of the 1000 ImageNet-1K wnids, in their official sorted order, to the CLIP-style class
    names that open_clip ships in that order (``open_clip.zero_shot_metadata.IMAGENET_CLASSNAMES``).
    Only the wnids are kept here, as data (``assets/imagenet_wnids.json``)."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    asset = resources.files("benchmarks") / "assets" / "imagenet_wnids.json"
    wnids = json.loads(asset.read_text(encoding="utf-8"))
    return dict(zip(wnids, IMAGENET_CLASSNAMES, strict=True))


def wnid_class_names(wnids: list[str]) -> list[str]:
    """Readable names for wnid folders; a wnid outside ImageNet-1K keeps its folder name."""
    names = imagenet_wnid_names()
    return [names.get(wnid, clean_class_name(wnid)) for wnid in wnids]


def require_root(data_root: Path | None, dataset: str) -> Path:
    if data_root is None:
        raise UserError(f"dataset '{dataset}' needs a data root: pass --data-root DIR")
    return Path(data_root).expanduser()


def check_choice(dataset: str, option: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise UserError(f"{dataset} option {option}={value!r} is not one of {', '.join(valid)}")


def check_type(dataset: str, option: str, value: Any, kinds: tuple[type, ...], what: str) -> None:
    """A suite's dataset option of the wrong type (``split_file = 5``): one line, not a traceback
    from deep inside the loader. ``bool`` is never a number here, although Python counts it as one."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise UserError(f"{dataset} option {option} must be {what}, not {value!r}")


def require(path: Path, what: str, how: str, is_dir: bool = False) -> None:
    """Raise a one-line ``DataNotFoundError`` unless ``path`` exists (as a folder if ``is_dir``)."""
    if not (path.is_dir() if is_dir else path.is_file()):
        raise DataNotFoundError(f"{what} not found: looked for {path}; {how}")


def scan_folder(directory: Path, class_to_idx: dict[str, int], what: str, how: str) -> list[tuple[str, int]]:
    """``make_dataset`` with its multi-line errors turned into one-line ``DataNotFoundError``."""
    from torchvision.datasets.folder import make_dataset

    try:
        return make_dataset(str(directory), class_to_idx, extensions=image_extensions())
    except FileNotFoundError as error:
        reason = " ".join(str(error).split())
        raise DataNotFoundError(f"{what}: {reason} (looked in {directory}); {how}") from None


def class_folders(directory: Path, what: str, how: str) -> list[str]:
    from torchvision.datasets.folder import find_classes

    require(directory, what, how, is_dir=True)
    try:
        return find_classes(str(directory))[0]
    except FileNotFoundError:
        raise DataNotFoundError(f"{what}: no class folders found in {directory}; {how}") from None


# --- splits of a folder of images --------------------------------------------------------------


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
    extensions = image_extensions()
    images = {part: [p for p in paths if p.lower().endswith(extensions)] for part, paths in lists.items()}
    for part, paths in images.items():
        if not paths:  # a run would learn, or be evaluated on, nothing
            dropped = " (none of its entries is an image path)" if lists[part] else ""
            raise UserError(
                f"split file {source} lists no {part} images{dropped}; give image paths relative to "
                "the dataset folder, e.g. n01443537/art_0.jpg"
            )
    return images


def folder_data(
    name: str, wnids: list[str], train: list[tuple[str, int]] | None, test: list[tuple[str, int]]
) -> ClassificationData:
    from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

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


def torchvision_target(
    name: str,
    title: str,
    root: Path,
    base: Path,
    split_file: str,
    extract: str,
    split: Callable[[str], Any],  # a torchvision dataset: its ``classes`` and ``_labels`` are read
    train_split: str,
    include_train: bool,
) -> ClassificationData:
    """A zero-shot target that torchvision reads from ``base`` under ``root``: its ``split_file``
    and ``images`` folder must be there (else one line that says how: ``extract`` by hand, or
    ``prepare``); ``split(s)`` builds split ``s``. The test split, and ``train_split`` if
    ``include_train``."""
    how = with_prepare_hint(name, root, f"or extract {extract}")
    require(base / split_file, title, how)
    require(base / "images", title, how, is_dir=True)
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


def load_split_folders(
    unit: DatasetUnit, data_root: Path | None, manual: str, splits: tuple[str, str] = ("train", "test")
) -> ClassificationData:
    """A unit's dataset stored as torchvision's ImageFolder layout, one per split:
    ``<folder>/<train>/<class>/*`` and ``<folder>/<test>/<class>/*``. Classes are the test split's
    folders, sorted, their names cleaned; ``manual`` says how to provide the files by hand."""
    from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

    root = require_root(data_root, unit.name)
    how = with_prepare_hint(unit.files_name, root, manual)
    train_dir, test_dir = (root / unit.disk_folder / split for split in splits)
    classes = class_folders(test_dir, unit.title, how)
    class_to_idx = {name: i for i, name in enumerate(classes)}
    train = FileListDataset(scan_folder(train_dir, class_to_idx, f"{unit.title} {splits[0]}", how))
    test = FileListDataset(scan_folder(test_dir, class_to_idx, f"{unit.title} {splits[1]}", how))
    return ClassificationData(
        name=unit.name,
        train=train,
        test=test,
        class_names=[clean_class_name(name) for name in classes],
        train_targets=list(train.targets),
        test_targets=list(test.targets),
    )


def load_zero_shot_target(name: str, data_root: str | Path | None = None) -> ClassificationData:
    """A zero-shot target: only its test split is read where the loader can skip the rest."""
    accepts_train_flag = "include_train" in inspect.signature(dataset_unit(name).load).parameters
    return load_dataset(name, data_root, **({"include_train": False} if accepts_train_flag else {}))


def load_dataset(name: str, data_root: str | Path | None = None, **options: Any) -> ClassificationData:
    """Load dataset ``name`` from ``data_root``; ``options`` go to its unit's loader (checked by name)."""
    loader = dataset_unit(name).load
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
