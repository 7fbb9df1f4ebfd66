"""What the fine-grained units read by the LAMDA family of CIL code bases share (not a unit itself:
its name starts with ``_``, so discovery skips it).

The family: PROOF (``zhoudw-zdw/PROOF``), C3Box (``LAMDA-CL/C3Box``), APER (``zhoudw-zdw/RevisitingCIL``)
and PILOT (``LAMDA-CL/LAMDA-PILOT``). Their ``utils/data.py`` reads each dataset as two torchvision
ImageFolders, ``train/`` and ``test/`` (C3Box writes ``val/``), that their users download from the
links in the READMEs; the labels are the sorted class folders' indices, and ``utils/data_manager.py``
orders the classes with ``np.random.seed(1993); np.random.permutation(n)`` over those labels (the
suite's ``seed1993``) and names label ``i`` with entry ``i`` of ``utils/labels.json``
(``assets/c3box_class_names.json``). Such a folder is the ``"lamda"`` layout of a unit here: its
split is the archive's own, which no file of those repositories lists.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.datasets import ClassificationData, check_choice, load_split_folders
from benchmarks.data.unit import Archive, DatasetUnit, PrepareContext, asset_json, count_dirs
from benchmarks.data.units._authors_split import held_out_folder

C3BOX = "LAMDA-CL/C3Box@1378ab2"
PROOF = "zhoudw-zdw/PROOF@0bb2052"
APER = "zhoudw-zdw/RevisitingCIL@a2e6b71"
#: how a unit's files may lie: as the official archive leaves them, or as the LAMDA family's
#: ImageFolder archives do (``<folder>/train/<class>/``, ``<folder>/test/<class>/`` or ``val/``)
LAYOUTS = ("official", "lamda")


def c3box_names(key: str) -> list[str]:
    """C3Box's class names for prompts (``utils/labels.json``), by label."""
    return asset_json("c3box_class_names.json")[key]


def check_layout(unit: DatasetUnit, layout: str, valid: tuple[str, ...] = LAYOUTS) -> None:
    check_choice(unit.name, "layout", layout, valid)


def load_lamda(
    unit: DatasetUnit, data_root: Path | None, names_key: str, n_classes: int
) -> ClassificationData:
    """The ``"lamda"`` layout: ImageFolder ``train/`` and ``test/`` (or ``val/``) under the unit's
    folder, its ``n_classes`` sorted class folders named as C3Box names them."""
    base = Path(data_root or ".").expanduser() / unit.disk_folder
    test = held_out_folder(base).name
    manual = (
        f"or extract the LAMDA family's archive of {unit.title} so that {base}/train/ and "
        f"{base}/{test}/ hold its class folders"
    )
    data = load_split_folders(unit, data_root, manual, ("train", test))
    if data.n_classes != n_classes:
        raise DataNotFoundError(
            f"{unit.title}: {base / test} holds {data.n_classes} class folders, but the LAMDA family's "
            f"{unit.title} has {n_classes}; {manual}"
        )
    data.class_names = c3box_names(names_key)[:n_classes]
    return data


def lamda_complete(base: Path, n_classes: int) -> bool:
    return count_dirs(base / "train") == n_classes == count_dirs(held_out_folder(base))


def missing_user_files(ctx: PrepareContext, files: list[Archive]) -> list[Path]:
    return [ctx.archives / a.filename for a in files if not (ctx.archives / a.filename).is_file()]


def install_user_files(
    ctx: PrepareContext, unit: DatasetUnit, files: list[Archive], inside: str, how: str
) -> None:
    """Files only the user can get (no official host serves them any more): each must be in
    ``ctx.archives`` and match its checksum; then the archives are extracted, and the other files
    copied, into ``<folder>/<inside>/`` in staging, installed whole. Nothing is downloaded, and a
    file that fails its checksum is left where it is."""
    missing = missing_user_files(ctx, files)
    if missing:
        raise UserError(
            f"{unit.files_name} needs files no official host serves any more ({how}); missing: "
            f"{', '.join(str(p) for p in missing)}. Put them there, or give their folder with --archives DIR"
        )
    for archive in files:
        path = ctx.archives / archive.filename
        found = ctx.checksum(path, "md5")
        if found != archive.checksum:
            raise UserError(
                f"{path} fails its MD5 check (expected {archive.checksum}, got {found}); it is left where it "
                "is: replace it with the official file"
            )
    with ctx.staging(unit.files_name) as staging:
        built = staging / unit.disk_folder
        (built / inside).mkdir(parents=True)
        for archive in files:
            path = ctx.archives / archive.filename
            if path.name.endswith((".tgz", ".tar.gz", ".tar", ".zip")):
                ctx.extract(path, built / inside)
            else:
                shutil.copyfile(path, built / inside / path.name)
        ctx.install(built, ctx.data_root / unit.disk_folder)
