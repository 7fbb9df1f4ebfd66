"""ImageNet-100 and ImageNet-1K: two datasets read from one folder, ``imagenet/{train,val}/<wnid>/``.

Both units share the target ``imagenet`` (``files_target``): ``prepare`` and ``fake_data`` make the
folder once, from the user's ILSVRC2012 archives (a login is needed to download them), for both.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.datasets import (
    ClassificationData,
    class_folders,
    folder_data,
    imagenet_wnid_names,
    require_root,
    scan_folder,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    CONTINUAL_CLIP,
    MG_CLIP,
    DataProtocol,
    DatasetUnit,
    PrepareContext,
    missing_or,
    random_jpeg,
    register_dataset,
)

#: the ILSVRC2012 archives ``prepare`` reads, by torchvision's part names (``ARCHIVE_META``)
ILSVRC = ("devkit", "val", "train")

#: ILSVRC2012 train images, the 1000 classes together
IMAGENET_TRAIN_IMAGES = 1_281_167


def ilsvrc_archives() -> dict[str, tuple[str, str]]:
    """File name and MD5 of each ILSVRC2012 archive, as torchvision's ImageNet checks them."""
    from torchvision.datasets.imagenet import ARCHIVE_META

    return {part: ARCHIVE_META[part] for part in ILSVRC}


@contextmanager
def _torchvision_extracting_through(ctx: PrepareContext) -> Iterator[None]:
    """torchvision's ImageNet parsers, extracting through ``ctx.extract`` (never unfiltered tarfile):
    they call ``extract_archive`` by the name their module imported."""
    from torchvision.datasets import imagenet

    def safe(from_path, to_path=None, remove_finished=False):
        to_path = os.path.dirname(from_path) if to_path is None else to_path
        ctx.extract(Path(from_path), Path(to_path))
        if remove_finished:
            os.remove(from_path)
        return to_path

    original = imagenet.extract_archive
    imagenet.extract_archive = safe
    try:
        yield
    finally:
        imagenet.extract_archive = original


class ImageNet(DatasetUnit):
    """The folder, files, preparation and fake writer both ImageNet datasets read."""

    folder = "imagenet"
    files_target = "imagenet"

    def load_classes(
        self, data_root: Path | None, n_classes: int, include_train: bool = True
    ) -> ClassificationData:
        """ImageNet's train and val folders, restricted to the first ``n_classes`` of the 1000 sorted
        ImageNet-1K wnids. Every one of them must be there: a partial copy never passes for the full
        dataset. ``include_train=False`` reads only val (a zero-shot target never scans 1.28M files)."""
        name = self.name
        root = require_root(data_root, name)
        train_dir, val_dir = root / self.folder / "train", root / self.folder / "val"
        how = with_prepare_hint(
            self.files_name,
            root,
            f"from your ILSVRC2012 archives, into {root / self.folder}/{{train,val}}/<wnid>/",
        )
        wnids = sorted(imagenet_wnid_names())[:n_classes]
        scanned = [val_dir] + ([train_dir] if include_train else [])
        for directory in scanned:
            found = set(class_folders(directory, f"ImageNet {directory.name}", how))
            missing = [w for w in wnids if w not in found]
            if missing:
                sort_hint = " (sort the val images into one folder per wnid)" if directory == val_dir else ""
                raise DataNotFoundError(
                    f"{name} needs the {len(wnids)} ImageNet wnid folders {wnids[0]}..{wnids[-1]} "
                    f"in {directory}, "
                    f"but {len(missing)} are missing, e.g. {directory / missing[0]}{sort_hint}; {how}"
                )
        class_to_idx = {w: i for i, w in enumerate(wnids)}
        test = scan_folder(val_dir, class_to_idx, "ImageNet val", how)
        train = scan_folder(train_dir, class_to_idx, "ImageNet train", how) if include_train else None
        return folder_data(name, wnids, train, test)

    def describe_files(self) -> str:
        return f"{self.folder}/{{train,val}}/<wnid>/ from your ILSVRC2012 archives (--archives)"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        wnids = set(imagenet_wnid_names())
        checks = []
        for split in ("train", "val"):
            found = {p.name for p in (base / split).iterdir()} if (base / split).is_dir() else set()
            checks.append((wnids <= found, f"{split}/ lacks {len(wnids - found)} of the 1000 wnid folders"))
        return missing_or(checks, base)

    def unavailable(self, ctx: PrepareContext) -> str | None:
        if all((ctx.archives / name).is_file() for name, _ in ilsvrc_archives().values()):
            return None
        return f"its ILSVRC2012 archives are not in {ctx.archives}"

    def prepare(self, ctx: PrepareContext) -> None:
        """torchvision's parsers on the user's archives, in staging (they write their ``meta.bin``
        beside the archives, which may be read-only): each verifies its archive's MD5 before
        extracting it."""
        from torchvision.datasets import imagenet

        files = {part: ctx.archives / name for part, (name, _) in ilsvrc_archives().items()}
        missing = [str(path) for path in files.values() if not path.is_file()]
        if missing:
            raise UserError(
                f"imagenet needs the official ILSVRC2012 archives, which need a login to download "
                f"(image-net.org); missing: {', '.join(missing)}. Put them there, or give their folder "
                "with --archives DIR"
            )
        with ctx.staging(self.files_name) as staging:
            for path in files.values():
                (staging / path.name).symlink_to(path.resolve())
            if ctx.progress:
                print(
                    "imagenet: devkit, then val (6.3 GB), then train (138 GB): MD5 checks and extraction "
                    "take a while",
                    file=sys.stderr,
                )
            try:
                with _torchvision_extracting_through(ctx):
                    imagenet.parse_devkit_archive(str(staging))
                    imagenet.parse_val_archive(str(staging), folder="val")
                    imagenet.parse_train_archive(str(staging), folder="train")
            except RuntimeError as err:  # torchvision: "The archive NAME is not present ... or is corrupted"
                named = re.search(r"archive (\S+) is", str(err))
                which = named.group(1) if named else "archive"
                raise UserError(
                    f"{ctx.archives / which} is damaged: it fails torchvision's MD5 check; it is left "
                    "where it is: download it again"
                ) from None
            built = staging / self.folder
            built.mkdir()
            for split in ("train", "val"):
                os.replace(staging / split, built / split)
            ctx.install(built, ctx.data_root / self.folder)

    def write_fake(self, root: Path, n_train: int, n_val: int, rng: np.random.RandomState) -> Path:
        """``imagenet/{train,val}/<wnid>/*.JPEG`` for all 1000 wnids (as ``prepare imagenet`` leaves
        them)."""
        base = root / self.folder
        for wnid in tqdm(list(imagenet_wnid_names()), desc="fake imagenet", leave=False):
            for split, count in (("train", n_train), ("val", n_val)):
                (base / split / wnid).mkdir(parents=True, exist_ok=True)
                for i in range(count):
                    random_jpeg(base / split / wnid / f"{wnid}_{i}.JPEG", rng)
        return base


@register_dataset("imagenet100")
class ImageNet100(ImageNet):
    title = "ImageNet-100"
    list_position = 3
    n_classes = 100
    published = {
        "continual_clip": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"{CONTINUAL_CLIP}: class_orders/imagenet100.yaml (= seed 1993, checked); "
            "dataset_reqs/imagenet100_classes.txt (= OpenAI's names, checked); "
            "configs/class/imagenet100_10-10.yaml prompt_template",
        ),
        "mg_clip": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"{MG_CLIP}: class_orders/imagenet100.yaml (= seed 1993, checked); "
            "dataset_reqs/imagenet100_classes.txt (= OpenAI's names, checked); "
            "configs/class/imagenet100_10-10.yaml prompt_template",
        ),
    }

    def load(
        self, data_root: Path | None, n_classes: int = 100, include_train: bool = True
    ) -> ClassificationData:
        """ImageNet-100: the first ``n_classes`` sorted ImageNet-1K wnids; ImageNet val as test."""
        if not 1 <= n_classes <= 1000:
            raise UserError(f"imagenet100 option n_classes={n_classes} must be between 1 and 1000")
        return self.load_classes(data_root, n_classes, include_train)

    def image_counts(self, n_classes: int = 100, **options: Any) -> tuple[int, int]:
        """ImageNet-1K's mean of 1,281 training images a class (between 732 and 1,300), 50 val."""
        return round(n_classes * IMAGENET_TRAIN_IMAGES / 1000), 50 * n_classes


@register_dataset("imagenet1k")
class ImageNet1K(ImageNet):
    title = "ImageNet-1K"
    list_position = 4
    n_classes = 1000
    published = {
        "continual_clip": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"{CONTINUAL_CLIP}: class_orders/imagenet1000.yaml (= seed 1993, checked); "
            "dataset_reqs/imagenet1000_classes.txt (= OpenAI's names, checked); "
            "configs/class/imagenet1000_100-100.yaml prompt_template",
        ),
        "mg_clip": DataProtocol(
            "seed1993",
            {},
            "a good photo of a {}.",
            f"inferred: {MG_CLIP} has no ImageNet-1K order or config; its codebase's parent "
            f"{CONTINUAL_CLIP} class_orders/imagenet1000.yaml is seed 1993; "
            "dataset_reqs/imagenet1000_classes.txt (= OpenAI's names, checked); the template of its "
            "other configs",
        ),
    }

    def load(self, data_root: Path | None, include_train: bool = True) -> ClassificationData:
        """ImageNet-1K: all 1000 wnid folders of ImageNet train; ImageNet val as test."""
        return self.load_classes(data_root, 1000, include_train)

    def image_counts(self, **options: Any) -> tuple[int, int]:
        return IMAGENET_TRAIN_IMAGES, 50_000
