"""Dataset units: everything one dataset is, in one class, registered by name as strategies are.

A unit (``DatasetUnit``) is one module of ``benchmarks/data/units/`` with ``@register_dataset``. It
holds the folder it lives in under the data root (written once), the files it is made from with
their checksums (``archives``), how ``prepare`` turns them into that folder (``prepare``) and how it
checks the result (``state``), the fake writer of ``benchmarks.tools.fake_data`` (``write_fake``),
the loader (``load``), its class names, its fixed class orders (``class_orders``) and the data
protocols the published numbers on it used (``published``). Every command reads datasets from here:
``prepare`` (``--list`` included), ``fake_data``, ``resized_cache``, ``load_dataset``, the class
orders, ``protocols`` and the report's names. Every module of the package is imported on the first
lookup, so a new dataset is one new file (``docs/adding-a-dataset.md``).

One vocabulary: a unit's registered name is the dataset's name everywhere (suites, ``--datasets``,
results, reports). ``prepare`` and ``fake_data`` work on the files on disk, and files that several
datasets read are prepared once: ImageNet-100 and ImageNet-1K both read ``imagenet/``, so their
units share the *target* ``imagenet`` (``files_target``). A unit's target is its own name unless it
shares one. Both commands take a target or the name of any dataset that reads it
(``prepare imagenet100`` prepares ``imagenet``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
from PIL import Image

from benchmarks.core.errors import UserError
from benchmarks.core.registry import Registry

# --- what a unit declares ----------------------------------------------------------------------


@dataclass(frozen=True)
class Archive:
    """One file to download: its official URL and checksum (MD5 or SHA-256, hex)."""

    url: str
    checksum: str
    algorithm: str = "md5"

    @property
    def filename(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def source(self, mirror: str | None) -> str:
        return f"{mirror.rstrip('/')}/{self.filename}" if mirror else self.url


#: the code bases whose published numbers a unit's ``published`` protocols describe (repo@commit)
CONTINUAL_CLIP = "vgthengane/Continual-CLIP@6500b8e"
MG_CLIP = "linlany/MindtheGap@f40bfce"
RAPF = "linlany/RAPF@81d41df"


@dataclass(frozen=True)
class DataProtocol:
    """One dataset under one source's protocol. ``dataset_options`` go to the dataset loader
    (``benchmarks.data.datasets``); ``prompt_template`` is None where the source sets no prompt
    for the method (its own recipe then holds)."""

    class_order: str
    dataset_options: dict[str, Any] = field(default_factory=dict)
    prompt_template: str | None = None
    source: str = ""  # where each fact comes from


class PrepareContext(Protocol):
    """What ``python -m benchmarks.prepare`` gives a unit's ``state`` and ``prepare``: the folders,
    the options, and its safe steps (they live in the command, a layer above the data)."""

    data_root: Path
    archives: Path  # where downloads go and where a user's own archives are looked for
    force: bool
    progress: bool

    def download_and_install(
        self, target: str, archives: list[Archive], top: str, into_top: bool = False
    ) -> None: ...

    def staging(self, target: str) -> AbstractContextManager[Path]: ...

    def install(self, built: Path, final: Path) -> None: ...

    def extract(self, archive: Path, into: Path) -> None: ...

    def checksum(self, path: Path, algorithm: str = "md5") -> str: ...  # a user's file, as prepare checks


# --- the base class ------------------------------------------------------------------------------


class DatasetUnit:
    """One dataset. A subclass sets the class attributes and overrides what applies to it; the
    defaults are those of a dataset with nothing on disk (the synthetic world)."""

    #: set by ``register_dataset``: the dataset's name in suites, runs, results and reports
    name: ClassVar[str] = ""
    #: its name in tables and reports (default: ``name``)
    title: ClassVar[str] = ""
    #: its folder under the data root, the only place the name is written; None: nothing on disk
    folder: ClassVar[str | None] = None
    #: the ``prepare`` and ``fake_data`` name of its files when other datasets read them too
    files_target: ClassVar[str] = ""
    #: the archives hold the folder's subfolders, not the folder (Pets): extract into the folder
    archives_hold_contents: ClassVar[bool] = False
    #: where it is listed (``--list``, "valid: ..."): the paper's datasets first, then by name
    list_position: ClassVar[float] = math.inf
    #: fixed class orders by ``--class-order`` name (each a permutation of the dataset's labels)
    class_orders: ClassVar[dict[str, tuple[int, ...]]] = {}
    #: the data protocol of each source whose published numbers on it a suite can reproduce,
    #: by source (``benchmarks.data.protocols``)
    published: ClassVar[dict[str, DataProtocol]] = {}
    #: its class count under its default options (None: set by its options); a half-base split
    #: ``B{m}-Inc{n}`` is checked against it before any file is read
    n_classes: ClassVar[int | None] = None
    #: the task split each published source reports on it, by source: ``"B0-Inc20"`` (equal tasks of
    #: 20), ``"B50-Inc10"`` (a first task of 50 classes, then tasks of 10)
    published_splits: ClassVar[dict[str, str]] = {}

    @property
    def target(self) -> str | None:
        """The name ``prepare`` and ``fake_data`` give its files; None with nothing on disk."""
        return self.files_name if self.folder else None

    @property
    def files_name(self) -> str:
        """``target`` for a unit with files: what its loading and preparing call them."""
        return self.files_target or self.name

    @property
    def disk_folder(self) -> str:
        """``folder`` for a unit with files (a unit with nothing on disk has none to read)."""
        if self.folder is None:
            raise TypeError(f"dataset {self.name!r} has nothing on disk")
        return self.folder

    # --- loading ---
    def load(self, *args: Any, **options: Any) -> Any:
        """``load(data_root, **options)``: the dataset as a ``ClassificationData``, read under the
        data root (``Path | None``); its options are a unit's own keyword arguments of this method (a
        suite's ``[dataset.NAME]`` table), checked by name before it is called."""
        raise NotImplementedError

    def class_count(self, **options: Any) -> int | None:
        """Its class count under ``options`` (its ``load`` keywords), known without reading a file: a
        half-base split is checked and sized with it. Default: an ``n_classes`` option, else
        ``n_classes``."""
        count = options.get("n_classes", self.n_classes)
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def image_counts(self, **options: Any) -> tuple[int, int] | None:
        """(training, test) images of the real dataset under ``options`` (its ``load`` keywords;
        others ignored), known without reading a file: ``benchmarks.run --dry-run`` turns them into
        GPU-hours before the data is there. None where the size is not known in advance."""
        return None

    # --- files and preparing ---
    def archives(self) -> list[Archive]:
        """The files it is made from, with their checksums (empty: the user provides them)."""
        return []

    def describe_files(self) -> str:
        """One line for ``prepare --help``: the folder and where it comes from."""
        return f"{self.folder}/ from {', '.join(a.filename for a in self.archives())}"

    def state(self, ctx: PrepareContext) -> str:
        """``present``, ``missing`` or ``corrupt: <why>`` (``missing_or`` builds it from checks)."""
        return missing_or([], ctx.data_root / self.disk_folder)

    def prepare(self, ctx: PrepareContext) -> None:
        """Make ``state`` present: by default, download the archives (verified), extract them in
        staging and install the folder whole."""
        if not self.archives():  # nothing to download: only the user can provide the folder
            raise UserError(
                f"{self.files_name} has no files to download; put its folder at "
                f"{ctx.data_root / self.disk_folder}"
            )
        ctx.download_and_install(
            self.files_name, self.archives(), self.disk_folder, self.archives_hold_contents
        )

    def unavailable(self, ctx: PrepareContext) -> str | None:
        """Why ``prepare all`` skips it although missing (files only the user can get), or None."""
        return None

    # --- fake data ---
    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """Write its folder under ``root`` in the real layout, with its real class list and a few
        random images a class; returns the folder."""
        raise NotImplementedError

    @property
    def writes_fake(self) -> bool:
        return self.folder is not None and type(self).write_fake is not DatasetUnit.write_fake


# --- helpers for units -----------------------------------------------------------------------------


def missing_or(checks: list[tuple[bool, str]], anchor: Path) -> str:
    """``missing`` without ``anchor``, else ``corrupt: <first failed check>`` or ``present``."""
    if not anchor.exists():
        return "missing"
    broken = [why for ok, why in checks if not ok]
    return f"corrupt: {broken[0]}" if broken else "present"


def count_dirs(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else 0


def random_jpeg(path: Path, rng: np.random.RandomState) -> None:
    """A random RGB JPEG of a random size (real datasets' sizes vary; the transforms resize)."""
    height, width = rng.randint(40, 97, size=2)
    Image.fromarray(rng.randint(0, 256, (height, width, 3), dtype=np.uint8)).save(path, quality=80)


def asset_json(name: str) -> Any:
    """A JSON file shipped in ``benchmarks/assets``."""
    return json.loads((resources.files("benchmarks") / "assets" / name).read_text(encoding="utf-8"))


# --- the registry -----------------------------------------------------------------------------------

UNITS_PACKAGE = "benchmarks.data.units"
#: every dataset unit by name: one instance of each registered class
DATASETS: Registry[DatasetUnit] = Registry(UNITS_PACKAGE, "dataset")


def register_dataset(name: str) -> Callable[[type[DatasetUnit]], type[DatasetUnit]]:
    """Class decorator: register one instance of a ``DatasetUnit`` subclass as dataset ``name``."""

    def wrap(cls: type[DatasetUnit]) -> type[DatasetUnit]:
        cls.name = name
        cls.title = cls.__dict__.get("title") or name
        DATASETS.add(name, cls())
        return cls

    return wrap


def dataset_units() -> dict[str, DatasetUnit]:
    """Every registered dataset by name, in listing order (``list_position``, then name)."""
    return dict(sorted(DATASETS.all().items(), key=lambda item: (item[1].list_position, item[0])))


def dataset_names() -> list[str]:
    return list(dataset_units())


def dataset_unit(name: str) -> DatasetUnit:
    units = dataset_units()
    if name not in units:
        raise UserError(f"unknown dataset '{name}'; valid: {', '.join(units)}")
    return units[name]


def file_targets() -> dict[str, DatasetUnit]:
    """Each target (files on disk that ``prepare`` and ``fake_data`` name) and the first dataset
    that reads it, in listing order: the datasets that share a target share its steps."""
    found: dict[str, DatasetUnit] = {}
    for unit in dataset_units().values():
        if unit.target is not None:
            found.setdefault(unit.target, unit)
    return found


def target_of(name: str) -> str | None:
    """The target ``name`` means: a target itself, or the target of a dataset that reads it."""
    if name in file_targets():
        return name
    unit = dataset_units().get(name)
    return unit.target if unit is not None else None


def iter_published() -> Iterator[tuple[str, str, DataProtocol]]:
    """(source, dataset, protocol) of every unit's ``published`` protocols, in listing order."""
    for name, unit in dataset_units().items():
        for source, protocol in unit.published.items():
            yield source, name, protocol
