"""ImageNet-R: 30,000 renditions of 200 ImageNet classes, one folder per wnid, split by a list."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.datasets import (
    ROOT_HINT,
    ClassificationData,
    check_choice,
    check_type,
    class_folders,
    folder_data,
    is_fake_data_root,
    read_split_list,
    require,
    require_root,
    scan_folder,
    stratified_split,
    with_prepare_hint,
)
from benchmarks.data.unit import (
    MG_CLIP,
    RAPF,
    Archive,
    DataProtocol,
    DatasetUnit,
    PrepareContext,
    asset_json,
    count_dirs,
    missing_or,
    random_jpeg,
    register_dataset,
)

#: RAPF's ImageNet-R split list (linlany/RAPF, imgr_split/imgr_train_test_split.txt, commit 81d41df),
#: the list MG-CLIP's README points to: 24,000 train and 6,000 test paths ``<wnid>/<file>``, one per
#: line under a "train" and a "test" line. Shipped without its one stray entry
#: (``n02437616/test_img_R.py``, not an image). docs/baselines.md §3.
RAPF_SPLIT = "imagenet_r_split_rapf.txt"
IMAGENET_R_SPLITS = ("rapf", "stratified")

# MG-CLIP's fixed ImageNet-R order (linlany/MindtheGap, class_orders/imagenet_R.yaml, commit f40bfce):
# indices into the 200 sorted ImageNet-R wnids, as its ImageFolder labels them and as this suite does.
MG_CLIP_IMAGENET_R_ORDER: tuple[int, ...] = (
    150, 119, 193, 2, 75, 179, 129, 68, 145, 53, 171, 133, 31, 103, 146, 174, 149, 40, 142, 30,
    183, 156, 167, 166, 124, 56, 109, 198, 185, 170, 51, 55, 77, 32, 45, 23, 115, 39, 134, 177,
    12, 126, 130, 37, 19, 34, 0, 135, 161, 108, 128, 18, 141, 24, 154, 160, 78, 85, 89, 73,
    152, 112, 114, 104, 44, 93, 138, 107, 100, 163, 3, 148, 147, 35, 199, 50, 25, 96, 79, 172,
    98, 140, 22, 162, 6, 27, 60, 144, 197, 67, 165, 196, 102, 71, 65, 47, 9, 122, 42, 63,
    61, 180, 97, 84, 157, 168, 69, 41, 83, 92, 190, 191, 59, 72, 111, 155, 105, 57, 17, 116,
    13, 28, 43, 136, 5, 14, 169, 7, 62, 110, 189, 95, 8, 4, 137, 194, 90, 74, 70, 113,
    186, 132, 192, 33, 36, 158, 188, 94, 121, 164, 58, 11, 178, 151, 184, 1, 10, 64, 15, 106,
    52, 176, 26, 81, 82, 88, 125, 46, 123, 91, 187, 86, 20, 76, 80, 66, 120, 131, 16, 159,
    101, 87, 99, 195, 143, 21, 49, 38, 181, 29, 153, 54, 173, 127, 117, 182, 139, 118, 48, 175,
)  # fmt: skip

# The official archive (github.com/hendrycks/imagenet-r); its README publishes no checksum, so this
# is the MD5 that torch-uncertainty's ImageNetR dataset verifies for the same file.
IMAGENET_R = Archive(
    "https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar", "a61312130a589d0ca1a8fca1f2bd3337"
)


def rapf_split_list() -> dict[str, list[str]]:
    """The shipped RAPF ImageNet-R split (``RAPF_SPLIT``)."""
    asset = resources.files("benchmarks") / "assets" / RAPF_SPLIT
    return read_split_list(asset.read_text(encoding="utf-8"), f"benchmarks/assets/{RAPF_SPLIT}")


@functools.lru_cache(maxsize=1)
def mg_clip_imagenet_r_names() -> dict[str, str]:
    """MG-CLIP's ImageNet-R class names by wnid (``assets/imagenet_r_names_mg_clip.json``: its
    ``dataset_reqs/imagenet_R_classes.txt``, kept as written, underscores included)."""
    asset = asset_json("imagenet_r_names_mg_clip.json")
    return dict(zip(asset["wnids"], asset["names"], strict=True))


def imagenet_r_wnids() -> list[str]:
    """The 200 ImageNet-R wnids (``assets/imagenet_r_wnids.json``: the 200 indices into the sorted
    1000 that github.com/hendrycks/imagenet-r ``eval.py`` lists)."""
    return asset_json("imagenet_r_wnids.json")


def split_from_lists(
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
                f"(python -m benchmarks.prepare imagenet_r --force) or fix the split file {ROOT_HINT}"
            )
        parts[part] = [(str(folder / p), label_of[p]) for p in relative if p in label_of]
    overlap = {p for p, _ in parts["train"]} & {p for p, _ in parts["test"]}
    if overlap:
        raise UserError(
            f"split {source} puts {len(overlap)} image(s) in both train and test, e.g. {min(overlap)}"
        )
    return parts["train"], parts["test"]


@register_dataset("imagenet_r")
class ImagenetR(DatasetUnit):
    title = "ImageNet-R"
    folder = "imagenet-r"
    list_position = 2
    n_classes = 200
    class_orders = {"mg_clip_imagenet_r": MG_CLIP_IMAGENET_R_ORDER}
    published = {
        "mg_clip": DataProtocol(
            "mg_clip_imagenet_r",
            {"split": "rapf", "class_names": "mg_clip"},
            "a good photo of a {}.",
            f"{MG_CLIP}: class_orders/imagenet_R.yaml; README points to {RAPF} "
            "imgr_split/imgr_train_test_split.txt; dataset_reqs/imagenet_R_classes.txt; "
            "configs/class/imagenet_r_20-20.yaml prompt_template",
        ),
    }

    def load(
        self,
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
        name = self.name
        check_choice(name, "split", split, IMAGENET_R_SPLITS)
        check_choice(name, "class_names", class_names, ("openai", "mg_clip"))
        root = require_root(data_root, name)
        check_type(name, "split_seed", split_seed, (int,), "an integer")
        check_type(name, "train_fraction", train_fraction, (int, float), "a number")
        if split_file is not None:
            check_type(name, "split_file", split_file, (str, Path), "the path of a split list")
        if not 0.0 < train_fraction < 1.0:
            raise UserError(f"train_fraction must be between 0 and 1, got {train_fraction}")
        if not 0 <= split_seed < 2**32:  # numpy's RandomState takes no other seed
            raise UserError(f"{name} option split_seed must be between 0 and {2**32 - 1}, got {split_seed}")
        folder = root / self.folder
        how = with_prepare_hint(self.files_name, root, f"or extract imagenet-r.tar into {root}")
        wnids = class_folders(folder, self.title, how)
        samples = scan_folder(folder, {w: i for i, w in enumerate(wnids)}, self.title, how)
        if split_file is not None:
            path = Path(split_file).expanduser()
            require(path, "ImageNet-R split file", "give an existing split list (JSON or RAPF's text format)")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise UserError(
                    f"split file {path} is not UTF-8 text (a bad byte at offset {err.start}); save it as "
                    "UTF-8 (JSON or RAPF's text format)"
                ) from None
            lists = read_split_list(text, str(path))
            train, test = split_from_lists(samples, folder, lists, f"file {path}", partial=False)
        elif split == "rapf":
            # fake data (benchmarks.tools.fake_data) holds a few of the listed images of each class
            partial = is_fake_data_root(root)
            train, test = split_from_lists(samples, folder, rapf_split_list(), "rapf", partial)
        else:
            train, test = stratified_split(samples, train_fraction, split_seed)
        data = folder_data(name, wnids, train, test)
        if class_names == "mg_clip":
            names = mg_clip_imagenet_r_names()
            data.class_names = [names.get(wnid, name) for wnid, name in zip(wnids, data.class_names)]
        return data

    def archives(self) -> list[Archive]:
        return [IMAGENET_R]

    def state(self, ctx: PrepareContext) -> str:
        base = ctx.data_root / self.folder
        return missing_or([(count_dirs(base) == 200, f"{base} does not hold 200 wnid folders")], base)

    def image_counts(
        self, split: str = "rapf", train_fraction: float = 0.8, split_file=None, **options: Any
    ) -> tuple[int, int] | None:
        """RAPF's list: 24,000 and 6,000 (``RAPF_SPLIT``); ``stratified``: the 30,000 split by
        ``train_fraction`` (per class in fact, so within a few images of this); a file of the
        user's own: unknown."""
        if split_file is not None:
            return None
        if split == "rapf":
            return 24_000, 6_000
        train = round(30_000 * train_fraction)
        return train, 30_000 - train

    def write_fake(self, root: Path, n_train: int, n_test: int, rng: np.random.RandomState) -> Path:
        """``imagenet-r/<wnid>/*.jpg`` for the 200 ImageNet-R wnids, named as the shipped RAPF split
        lists them: each class's first ``n_train`` train and ``n_test`` test files, so that both the
        list (``split = "rapf"``) and the stratified split walk."""
        base = root / self.folder
        lists = rapf_split_list()
        for wnid in imagenet_r_wnids():
            (base / wnid).mkdir(parents=True, exist_ok=True)
        for part, count in (("train", n_train), ("test", n_test)):
            taken: dict[str, int] = {}
            for path in lists[part]:
                wnid = path.split("/")[0]
                if taken.get(wnid, 0) < count:
                    taken[wnid] = taken.get(wnid, 0) + 1
                    random_jpeg(base / path, rng)
        return base
