"""ObjectNet (200 classes): the subset and split of the APER authors' archive, read as their code reads it.

ObjectNet's licence lets no one redistribute or download it without accepting it, so there is nothing
``prepare`` can fetch: APER's README (zhoudw-zdw/RevisitingCIL@a2e6b71, also LAMDA-CL/C3Box@1378ab2
and LAMDA-CL/LAMDA-PILOT@5240714) links its authors' ImageFolder archive, ``train/<class>/`` and
``test/<class>/`` (C3Box names the test folder ``val/``) of 200 of ObjectNet's 313 classes. Those
200 are the first 200 ObjectNet folder names in sorted order (``air_freshener`` .. ``plunger``:
checked against ObjectNet's folder list, JiazuoYu/MoE-Adapters4CL@4572d97
``cil/datasets_ref/objectnet_metadata/folder_to_objectnet_label.json``), and C3Box's
``utils/labels.json`` ``objectnet`` names them by label, each folder name with its underscores made
spaces (checked, all 200). The train/test split is the archive's own: no list of it is published.
Labels are the sorted folders' indices (``datasets.ImageFolder``), so the LAMDA class order,
``np.random.seed(1993); np.random.permutation(200)`` (``utils/data_manager.py``), is this suite's
``seed1993``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from benchmarks.core.errors import UserError
from benchmarks.data.datasets import ROOT_HINT, ClassificationData, folder_data, require_root
from benchmarks.data.unit import DatasetUnit, PrepareContext, asset_json, missing_or, register_dataset
from benchmarks.data.units._authors_split import (
    read_split_folders,
    split_folders_complete,
    write_split_folders,
)

#: where the authors' archive is linked from
APER_README = "the ObjectNet link of github.com/zhoudw-zdw/RevisitingCIL's README"


@functools.lru_cache(maxsize=1)
def objectnet_classes() -> tuple[list[str], list[str]]:
    """The 200 class folders, sorted, and C3Box's names for them (``assets/objectnet_200_c3box.json``)."""
    asset = asset_json("objectnet_200_c3box.json")
    return asset["folders"], asset["names"]


@register_dataset("objectnet")
class ObjectNet(DatasetUnit):
    title = "ObjectNet"
    folder = "objectnet"
    list_position = 13
    n_classes = 200
    #: APER's exps/*/objectnet_10_10_*.json: init_cls 10, increment 10 (RevisitingCIL@a2e6b71)
    published_splits = {"aper": "B0-Inc10"}

    def manual(self, root: Path) -> str:
        return (
            f"ObjectNet comes only by hand, under its licence: get the APER authors' archive ({APER_README}) "
            f"and extract it so that {root / self.folder}/train and {root / self.folder}/test hold its 200 "
            "class folders"
        )

    def load(self, data_root: Path | None) -> ClassificationData:
        """ObjectNet-200 from ``{data_root}/objectnet/{train,test}/<class>/`` (``val/`` for ``test/``)."""
        root = require_root(data_root, self.name)
        folders, names = objectnet_classes()
        how = f"{self.manual(root)} ({ROOT_HINT})"
        train, test = read_split_folders(root / self.folder, folders, self.title, how)
        data = folder_data(self.name, folders, train, test)
        data.class_names = list(names)
        return data

    def describe_files(self) -> str:
        return f"{self.folder}/{{train,test}}/<class>/ from the APER authors' archive (by hand)"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        folders, _ = objectnet_classes()
        complete = split_folders_complete(base, folders)
        return missing_or([(complete, "train/ and test/ do not each hold the 200 class folders")], base)

    def unavailable(self, ctx: PrepareContext) -> str | None:
        return "ObjectNet comes only by hand, under its licence"

    def prepare(self, ctx: PrepareContext) -> None:
        raise UserError(f"objectnet cannot be downloaded: {self.manual(ctx.data_root)}")

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``objectnet/{train,test}/<folder>/*.jpg`` for the 200 ObjectNet folders."""
        base = root / self.folder
        write_split_folders(base, objectnet_classes()[0], n_train, n_test, rng)
        return base
