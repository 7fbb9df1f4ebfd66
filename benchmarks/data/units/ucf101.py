"""UCF-101, frame version: one frame a video of 100 of its 101 actions, as the LAMDA family (PROOF,
C3Box) streams it.

Its files: only the LAMDA family's ImageFolder archive (C3Box's README links it; it publishes no
checksum), put at ``ucf101/{train,test}/`` (or ``val/``): UCF-101 is published as videos, and no
official host serves its frames. Classes: PROOF's and C3Box's ``utils/data.py`` (``UCF101``:
``class_order = np.arange(100)``) and ``labels.json`` (ucf101: 100 names) use 100; the names are
UCF-101's ``classInd.txt`` order less the last action, ``YoYo`` (checked against openai/CLIP@d05afc4
data/prompts.md, UCF101). Labels: the sorted folders' indices, the suite's ``seed1993`` order is
their ``utils/data_manager.py``'s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.core.errors import UserError
from benchmarks.data.datasets import ClassificationData
from benchmarks.data.unit import DatasetUnit, PrepareContext, missing_or, register_dataset
from benchmarks.data.units._lamda import (
    c3box_names,
    check_layout,
    lamda_complete,
    lamda_test_folder,
    load_lamda,
    write_lamda_fake,
)

UCF_CLASSES = 100
#: where the archive comes from: the only source of the frames the published numbers used
SOURCE = "the UCF archive linked in LAMDA-CL/C3Box's README (Google Drive or OneDrive)"


@register_dataset("ucf101")
class Ucf101(DatasetUnit):
    title = "UCF-101"
    folder = "ucf101"
    list_position = 12
    n_classes = UCF_CLASSES
    # zhoudw-zdw/PROOF@0bb2052 exps/ucf.json (ucf101, init_cls 10, increment 10; ucfb50.json: 50, 10)
    published_splits = {"proof": "B0-Inc10"}

    def load(self, data_root: Path | None, layout: str = "lamda") -> ClassificationData:
        """The LAMDA family's ``ucf101/train/`` and ``test/`` (or ``val/``) frame folders, 100
        actions, named as C3Box names them (``Apply Eye Makeup``)."""
        check_layout(self, layout, ("lamda",))
        return load_lamda(self, data_root, "ucf101", UCF_CLASSES)

    def describe_files(self) -> str:
        return f"{self.folder}/{{train,test}}/<action>/ from {SOURCE}"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        test = lamda_test_folder(base)
        why = f"train/ and {test}/ do not each hold {UCF_CLASSES} action folders"
        return missing_or([(lamda_complete(base, UCF_CLASSES), why)], base)

    def unavailable(self, ctx: PrepareContext) -> str | None:
        return f"its frames come only from {SOURCE}"

    def prepare(self, ctx: PrepareContext) -> None:
        raise UserError(
            f"ucf101 has no official download (UCF-101 is published as videos): extract {SOURCE} so that "
            f"{ctx.data_root / self.folder}/train/ and test/ hold its {UCF_CLASSES} action folders"
        )

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``ucf101/{train,test}/<Action_Name>/*.jpg``, the folders sorting as C3Box's labels."""
        folders = [name.replace(" ", "_") for name in c3box_names("ucf101")]
        return write_lamda_fake(root / self.folder, folders, n_train, n_test, rng)
