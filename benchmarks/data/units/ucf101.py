"""UCF-101, frame version: one frame a video of 100 of its 101 actions, as the LAMDA family (PROOF,
C3Box) streams it.

Its files: UCF-101 is published as videos, and no official host serves its frames. The default,
``layout="lamda"``: the LAMDA family's ImageFolder archive (C3Box's README links it; it publishes no
checksum), put at ``ucf101/{train,test}/`` (or ``val/``), split as that archive is.
``layout="midframes"``: CoOp's middle frames (``UCF-101-midframes.zip``, KaiyangZhou/CoOp@ff61507
DATASETS.md) split by UCF-101's official ``ucfTrainTestlist/trainlist01.txt`` and
``testlist01.txt``, each video's frame at ``UCF-101-midframes/<action split at capitals, joined by
_>/<video>.jpg`` (CoOp's ``datasets/ucf101.py`` names them so). Classes: PROOF's and C3Box's
``utils/data.py`` (``UCF101``: ``class_order = np.arange(100)``) and ``labels.json`` (ucf101: 100
names) use 100; the names are UCF-101's ``classInd.txt`` order less the last action, ``YoYo``
(checked against openai/CLIP@d05afc4 data/prompts.md, UCF101). Labels: the sorted folders' indices
(``"lamda"``), ``classInd.txt``'s order (``"midframes"``): the same order, whose ``seed1993`` is
their ``utils/data_manager.py``'s.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.datasets import (
    ClassificationData,
    require,
    require_root,
    with_prepare_hint,
)
from benchmarks.data.unit import DatasetUnit, PrepareContext, missing_or, register_dataset
from benchmarks.data.units._authors_split import held_out_folder, write_split_folders
from benchmarks.data.units._lamda import (
    c3box_names,
    check_layout,
    lamda_complete,
    load_lamda,
)

UCF_CLASSES = 100
LAYOUTS = ("lamda", "midframes")
MIDFRAMES, SPLITS = "UCF-101-midframes", "ucfTrainTestlist"
#: the official split 1 of the recognition task: the lists the midframes layout reads
LISTS = ("classInd.txt", "trainlist01.txt", "testlist01.txt")
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
        """100 actions named as C3Box names them (``Apply Eye Makeup``): ``layout="lamda"``, the LAMDA
        family's ``ucf101/train/`` and ``test/`` (or ``val/``) frame folders; ``"midframes"``, CoOp's
        middle frames split by the official ``trainlist01.txt`` and ``testlist01.txt``."""
        from benchmarks.data.image_lists import FileListDataset  # torch, where images are built

        check_layout(self, layout, LAYOUTS)
        if layout == "lamda":
            return load_lamda(self, data_root, "ucf101", UCF_CLASSES)
        root = require_root(data_root, self.name)
        base = root / self.folder
        how = with_prepare_hint(
            self.files_name,
            root,
            f"or extract UCF-101-midframes.zip and UCF-101's {SPLITS} folder into {base}",
        )
        for name in LISTS:
            require(base / SPLITS / name, self.title, how)
        actions = [
            line.split()[1]
            for line in (base / SPLITS / "classInd.txt").read_text().splitlines()
            if line.strip()
        ]
        label_of = {action: label for label, action in enumerate(actions[:UCF_CLASSES])}
        parts = []
        for name in LISTS[1:]:
            samples = []
            for line in (base / SPLITS / name).read_text().splitlines():
                if not line.strip():
                    continue
                action, video = line.split()[0].split("/")
                if action in label_of:
                    folder = "_".join(re.findall("[A-Z][^A-Z]*", action))
                    samples.append(
                        (str(base / MIDFRAMES / folder / video.replace(".avi", ".jpg")), label_of[action])
                    )
            missing = [path for path, _ in samples[:1] if not Path(path).is_file()]
            if missing:
                raise DataNotFoundError(f"{self.title} frame not found: looked for {missing[0]}; {how}")
            parts.append(FileListDataset(samples))
        train, test = parts
        names = c3box_names("ucf101")
        return ClassificationData(self.name, train, test, names, list(train.targets), list(test.targets))

    def describe_files(self) -> str:
        return f"{self.folder}/{{train,test}}/<action>/ from {SOURCE}"

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        if all((base / SPLITS / name).is_file() for name in LISTS) and (base / MIDFRAMES).is_dir():
            return "present"
        test = held_out_folder(base).name
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
        write_split_folders(root / self.folder, folders, n_train, n_test, rng)
        return root / self.folder
