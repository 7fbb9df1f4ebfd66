"""ImageNet-A: 7,500 natural adversarial images of 200 ImageNet classes, one folder per wnid.

Two layouts, one folder (``imagenet-a/``):

* the official ``imagenet-a.tar`` (github.com/hendrycks/natural-adv-examples), which ``prepare``
  downloads: ``imagenet-a/<wnid>/*.jpg``, with no split. ``split = "stratified"`` splits it per class.
* the APER authors' archive (linked from zhoudw-zdw/RevisitingCIL@a2e6b71's README, and from
  LAMDA-CL/LAMDA-PILOT@5240714's): ``imagenet-a/train/<wnid>/`` and ``imagenet-a/test/<wnid>/``, as
  RevisitingCIL's ``utils/data.py`` reads it (C3Box's reads ``val/``). ``split = "aper"``, the
  default, is that split: it is the archive's own (no list of it is published), so it comes only
  from that archive, extracted by hand into ``imagenet-a/``.

The 200 wnids are the ImageNet-1K indices that the official ``eval.py`` keeps (``thousand_k_to_200``,
hendrycks/natural-adv-examples@0777070; ``assets/imagenet_a_wnids.json``), sorted as ImageFolder
labels them, so the LAMDA class order ``np.random.seed(1993); np.random.permutation(200)`` is this
suite's ``seed1993``. Class names are CLIP's ImageNet names (``open_clip``'s, by wnid), as the
ImageNet units use: C3Box's ``utils/labels.json`` ``imageneta`` list keeps only each name's first
word ("American", "box", "sea") and is not offered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError
from benchmarks.data.datasets import (
    ROOT_HINT,
    ClassificationData,
    check_choice,
    folder_data,
    require,
    require_root,
    scan_folder,
    stratified_split,
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
from benchmarks.data.units._authors_split import (
    check_split_options,
    read_split_folders,
    split_folders_complete,
    write_split_folders,
)

IMAGENET_A_SPLITS = ("aper", "stratified")
#: images in the official archive (7,500: Hendrycks et al., "Natural Adversarial Examples", CVPR 2021)
IMAGENET_A_IMAGES = 7_500

# The official archive; its README publishes no checksum, so this is the MD5 that torch-uncertainty's
# ImageNetA dataset verifies for the same file.
IMAGENET_A = Archive(
    "https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar", "c3e55429088dc681f30d81f4726b6595"
)


def imagenet_a_wnids() -> list[str]:
    """The 200 ImageNet-A wnids, sorted (``assets/imagenet_a_wnids.json``)."""
    return asset_json("imagenet_a_wnids.json")


@register_dataset("imagenet_a")
class ImagenetA(DatasetUnit):
    title = "ImageNet-A"
    folder = "imagenet-a"
    list_position = 14
    n_classes = 200
    #: APER's exps/*/imageneta_10_10_*.json: init_cls 10, increment 10 (RevisitingCIL@a2e6b71)
    published_splits = {"aper": "B0-Inc10"}

    def load(
        self, data_root: Path | None, split: str = "aper", split_seed: int = 0, train_fraction: float = 0.8
    ) -> ClassificationData:
        """ImageNet-A from ``{data_root}/imagenet-a``.

        ``split``: ``"aper"``, the APER authors' split (``train/`` and ``test/`` or ``val/``), or
        ``"stratified"``, the official wnid folders split per class: ``train_fraction`` of each to
        training, drawn with ``split_seed``.
        """
        name = self.name
        check_choice(name, "split", split, IMAGENET_A_SPLITS)
        check_split_options(name, split_seed, train_fraction)
        root = require_root(data_root, name)
        base, wnids = root / self.folder, imagenet_a_wnids()
        if split == "aper":
            how = (
                "the APER split comes only from its authors' archive (RevisitingCIL's README): extract "
                f"it so that {base}/train and {base}/test hold the 200 wnid folders, or set split = "
                '"stratified" to split the official archive (python -m benchmarks.prepare imagenet_a); '
                f"{ROOT_HINT}"
            )
            train, test = read_split_folders(base, wnids, self.title, how)
        else:
            how = with_prepare_hint(self.files_name, root, f"or extract imagenet-a.tar into {root}")
            require(base, self.title, how, is_dir=True)
            missing = [w for w in wnids if not (base / w).is_dir()]
            if missing:
                raise DataNotFoundError(
                    f"{self.title} needs the 200 wnid folders of the official archive in {base}, but "
                    f"{len(missing)} are missing, e.g. {base / missing[0]}; {how}"
                )
            samples = scan_folder(base, {w: i for i, w in enumerate(wnids)}, self.title, how)
            train, test = stratified_split(samples, train_fraction, split_seed)
        return folder_data(name, wnids, train, test)

    def archives(self) -> list[Archive]:
        return [IMAGENET_A]

    def describe_files(self) -> str:
        return f"{self.folder}/ from imagenet-a.tar (the APER split: its authors' archive, by hand)"

    def state(self, ctx: PrepareContext) -> str:
        base, wnids = ctx.data_root / self.folder, imagenet_a_wnids()
        official = all((base / w).is_dir() for w in wnids)
        aper = split_folders_complete(base, wnids)
        why = "it holds neither the 200 wnid folders nor train/ and test/ with them"
        return missing_or([(official or aper, why)], base)

    def image_counts(
        self, split: str = "aper", train_fraction: float = 0.8, **options: Any
    ) -> tuple[int, int] | None:
        """``stratified``: the 7,500 split by ``train_fraction`` (per class in fact, so within a few
        images of this); the APER archive's split: not published."""
        if split != "stratified":
            return None
        train = round(IMAGENET_A_IMAGES * train_fraction)
        return train, IMAGENET_A_IMAGES - train

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """Both layouts: the APER archive's ``imagenet-a/{train,test}/<wnid>/`` and the official
        ``imagenet-a/<wnid>/`` (``n_train + n_test`` images a class), so both splits walk."""
        base, wnids = root / self.folder, imagenet_a_wnids()
        write_split_folders(base, wnids, n_train, n_test, rng)
        for wnid in wnids:
            (base / wnid).mkdir(parents=True, exist_ok=True)
            for i in range(n_train + n_test):
                random_jpeg(base / wnid / f"{i}.jpg", rng)
        return base
