"""The datasets of the PTM and CLIP-CIL papers (ObjectNet, ImageNet-A, TinyImageNet, SUN397): on fake
data in their real layouts, their splits are disjoint and cover every class, their classes are the
published ones at the published labels, ``prepare`` says what it needs in one line, and every
registered strategy walks each of them end to end.

Known names at known labels are hand-checked against the published lists: C3Box's ``utils/labels.json``
(LAMDA-CL/C3Box@1378ab2: ``objectnet``, ``sun``), MoE-Adapters' ``cil/dataset_reqs/tinyimagenet_classes.txt``
(JiazuoYu/MoE-Adapters4CL@4572d97) and ImageNet-A's ``eval.py`` (hendrycks/natural-adv-examples@0777070:
ImageNet-1K classes 6, 11, 13, .., 988 in that order)."""

from __future__ import annotations

import hashlib
import io
import re
import socket
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks import run
from benchmarks.data.class_orders import resolve_class_order, seeded_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.unit import dataset_unit, random_jpeg
from benchmarks.data.units.imagenet_a import imagenet_a_wnids
from benchmarks.data.units.objectnet import objectnet_classes
from benchmarks.data.units.sun397 import sun300_names
from benchmarks.prepare import command as prepare
from benchmarks.runner.reading import iter_results
from benchmarks.tools.fake_data import make_fake_data
from strategies.registry import available
from tests.helpers import tiny_suite, write_suite

UNITS = ("objectnet", "imagenet_a", "tinyimagenet", "sun397")
#: (dataset, loader options) of every split the units read from their fake layout
SPLITS = [
    ("objectnet", {}),
    ("imagenet_a", {}),
    ("imagenet_a", {"split": "stratified"}),
    ("tinyimagenet", {}),
    ("sun397", {}),
]


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    """The four datasets' fake layouts, one training and one test image a class (a fast dev run
    takes one of each), written once for the module."""
    root = tmp_path_factory.mktemp("ptm-fake")
    make_fake_data(root, UNITS, train_per_class=1, test_per_class=1, weights=False)
    return root


# --- (a) the splits --------------------------------------------------------------------------------


@pytest.mark.parametrize("name, options", SPLITS)
def test_no_image_is_in_both_splits_and_every_class_is_in_each(fake, name, options):
    data = load_dataset(name, fake, **options)
    train = {path for path, _ in data.train.samples}
    test = {path for path, _ in data.test.samples}
    assert train and test and not train & test
    assert len(train) == len(data.train) and len(test) == len(data.test)  # no image listed twice
    classes = set(range(data.n_classes))
    assert set(data.train_targets) == set(data.test_targets) == classes
    assert all(Path(path).is_file() for path in train | test)


def test_the_authors_test_split_may_be_named_val_or_test(fake, tmp_path):
    # RevisitingCIL reads objectnet/test/, C3Box objectnet/val/: the same split under either name
    (tmp_path / "objectnet").symlink_to(fake / "objectnet")
    renamed = tmp_path / "renamed"
    (renamed / "objectnet").mkdir(parents=True)
    (renamed / "objectnet" / "train").symlink_to(fake / "objectnet" / "train")
    (renamed / "objectnet" / "val").symlink_to(fake / "objectnet" / "test")
    as_test, as_val = load_dataset("objectnet", tmp_path), load_dataset("objectnet", renamed)
    assert as_test.test_targets == as_val.test_targets and len(as_val.test) == 200


def test_a_class_folder_missing_from_a_split_is_one_line(fake, tmp_path):
    base = tmp_path / "imagenet-a"
    for split in ("train", "test"):
        (base / split).mkdir(parents=True)
        for wnid in sorted(p.name for p in (fake / "imagenet-a" / split).iterdir())[:-1]:
            (base / split / wnid).symlink_to(fake / "imagenet-a" / split / wnid)
    with pytest.raises(prepare.UserError) as error:
        load_dataset("imagenet_a", tmp_path)
    message = str(error.value)
    assert "\n" not in message and "lacks 1, e.g. n12267677" in message and "stratified" in message


# --- (b) the classes ------------------------------------------------------------------------------


def test_objectnet_is_the_first_200_objectnet_folders_with_c3box_names(fake):
    folders, names = objectnet_classes()
    assert folders == sorted(folders) and len(set(folders)) == 200
    assert names == [folder.replace("_", " ") for folder in folders]  # C3Box's names, checked
    data = load_dataset("objectnet", fake)
    assert data.n_classes == dataset_unit("objectnet").n_classes == 200
    assert (data.class_names[0], data.class_names[5], data.class_names[199]) == (
        "air freshener",
        "band aid",
        "plunger",
    )
    assert data.class_names[116] == "hand towel or rag" and data.class_names[100] == "fan"


def test_imagenet_a_is_eval_pys_200_wnids_with_clips_names(fake):
    data = load_dataset("imagenet_a", fake)
    assert data.n_classes == dataset_unit("imagenet_a").n_classes == 200
    known = {0: "stingray", 1: "goldfinch", 3: "American robin", 9: "box turtle", 199: "acorn"}
    assert {i: data.class_names[i] for i in known} == known
    stratified = load_dataset("imagenet_a", fake, split="stratified")
    assert stratified.class_names == data.class_names  # one class list, both layouts


def test_tinyimagenet_numbers_classes_as_wnids_txt_lists_them(fake):
    data = load_dataset("tinyimagenet", fake)
    assert data.n_classes == dataset_unit("tinyimagenet").n_classes == 200
    known = {0: "Egyptian Mau", 1: "fishing casting reel", 2: "volleyball", 3: "rocking chair", 4: "lemon"}
    assert {i: data.class_names[i] for i in known} == known
    first = Path(data.train.samples[0][0])
    assert first.parts[-3:] == ("n02124075", "images", "n02124075_0.JPEG") and data.train_targets[0] == 0
    order = resolve_class_order("moe_adapters_tinyimagenet", 200, "tinyimagenet")
    assert sorted(order) == list(range(200)) and order[:3] == [131, 181, 22] and order[-2:] == [194, 98]


def test_tinyimagenet_refuses_a_wnids_txt_in_another_order(fake, tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    base.mkdir()
    for entry in (fake / "tiny-imagenet-200").iterdir():
        if entry.name != "wnids.txt":
            (base / entry.name).symlink_to(entry)
    (base / "wnids.txt").write_text(
        "\n".join(sorted((fake / "tiny-imagenet-200/wnids.txt").read_text().split()))
    )
    with pytest.raises(prepare.UserError, match="official order"):
        load_dataset("tinyimagenet", tmp_path)


def test_sun_is_c3box_300_classes_by_label(fake):
    names = sun300_names()
    assert names == sorted(names) and len(set(names)) == 300
    data = load_dataset("sun397", fake)
    assert data.n_classes == dataset_unit("sun397").n_classes == 300
    known = {0: "abbey", 1: "airplane cabin", 35: "barndoor", 150: "fountain", 299: "ski slope"}
    assert {i: data.class_names[i] for i in known} == known


@pytest.mark.parametrize("name, n_classes", [("objectnet", 200), ("imagenet_a", 200), ("sun397", 300)])
def test_the_lamda_order_is_seed1993_over_the_sorted_class_folders(name, n_classes):
    # PyCIL's DataManager: np.random.seed(1993); order = np.random.permutation(n) over ImageFolder labels
    np.random.seed(1993)
    assert resolve_class_order("seed1993", n_classes, name) == list(np.random.permutation(n_classes))
    assert seeded_order(n_classes) == resolve_class_order("seed1993", n_classes, name)


PUBLISHED_SPLITS = {  # the exps JSON / config of each source (init_cls, increment), hand-checked
    "objectnet": {"aper": "B0-Inc10"},  # RevisitingCIL exps/*/objectnet_10_10_*.json
    "imagenet_a": {"aper": "B0-Inc10"},  # RevisitingCIL exps/*/imageneta_10_10_*.json
    "tinyimagenet": {"moe_adapters": "B100-Inc10"},  # MoE-Adapters configs/class/tinyimagenet_100-10.yaml
    "sun397": {},  # C3Box's exps set no per-dataset split
}


@pytest.mark.parametrize("name", UNITS)
def test_each_published_split_is_the_sources_and_fits_the_class_count(name):
    unit = dataset_unit(name)
    assert unit.published_splits == PUBLISHED_SPLITS[name]
    for split in unit.published_splits.values():
        first, size = map(int, re.fullmatch(r"B(\d+)-Inc(\d+)", split).groups())
        assert 0 <= first < unit.n_classes and size > 0 and (unit.n_classes - first) % size == 0


# --- (c) prepare ----------------------------------------------------------------------------------


def _prepare(capsys, *argv: str) -> tuple[int, str, float]:
    start = time.monotonic()
    code = prepare.main(list(argv))
    return code, capsys.readouterr().err, time.monotonic() - start


def test_objectnet_cannot_be_downloaded_and_prepare_says_so_in_one_line(tmp_path, capsys):
    root = tmp_path / "data"
    code, err, took = _prepare(capsys, "objectnet", "--data-root", str(root), "--quiet")
    assert code == 2 and err.count("\n") == 1 and took < 10
    assert "cannot be downloaded: ObjectNet comes only by hand, under its licence" in err
    assert f"{root / 'objectnet'}/train" in err
    assert [p for p in tmp_path.rglob("*") if not p.is_relative_to(root)] == []
    listing = prepare._list(prepare.Context(root, root / "archives"))
    assert f"| objectnet | missing | {root / 'objectnet'} |" in listing


@pytest.mark.parametrize(
    "name, url",
    [
        ("imagenet_a", "https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar"),
        ("tinyimagenet", "http://cs231n.stanford.edu/tiny-imagenet-200.zip"),
        ("sun397", "http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz"),
    ],
)
def test_offline_prepare_names_the_official_file_and_refuses_a_wrong_one(name, url, tmp_path, capsys):
    root = tmp_path / "data"
    with socket.socket() as closed:  # a port nothing listens on: no network
        closed.bind(("127.0.0.1", 0))
        offline = f"http://127.0.0.1:{closed.getsockname()[1]}"
    code, err, took = _prepare(capsys, name, "--data-root", str(root), "--mirror", offline, "--quiet")
    filename = url.rsplit("/", 1)[1]
    assert code == 2 and err.count("\n") == 1 and took < 10
    assert url in err and str(root / "archives" / filename) in err
    # the user's own copy that is not the official file: refused, left where it is, nothing extracted
    (root / "archives" / filename).write_bytes(b"not the official archive")
    code, err, _ = _prepare(capsys, name, "--data-root", str(root), "--mirror", offline, "--quiet")
    assert code == 2 and err.count("\n") == 1 and "fails its MD5 check" in err
    assert (root / "archives" / filename).read_bytes() == b"not the official archive"
    assert sorted(p.name for p in root.iterdir()) == ["archives"]
    assert [p for p in tmp_path.rglob("*") if not p.is_relative_to(root)] == []


def _tar(folder: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", dereference=True) as archive:  # links: their files
        archive.add(folder, arcname=arcname)
    return buffer.getvalue()


def _zip(folder: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            archive.write(path, f"{arcname}/{path.relative_to(folder).as_posix()}")
    return buffer.getvalue()


def _official_sun(folder: Path, rng) -> Path:
    """A three-class SUN397 in the official layout, a subclass among them (``ClassName.txt``)."""
    classes = ["/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop"]
    base = folder / "SUN397"
    for name in classes:
        (base / name[1:]).mkdir(parents=True)
        for i in range(5):
            random_jpeg(base / name[1:] / f"sun_{name[3:].replace('/', '_')}{i}.jpg", rng)
    (base / "ClassName.txt").write_text("\n".join(classes) + "\n")
    return base


def test_the_official_archives_are_downloaded_verified_and_split(fake, tmp_path, capsys, monkeypatch):
    """From a mirror folder: each official archive (made from the fake layouts, with its checksum in
    the unit's table), extracted and installed, read with the split that archive allows."""
    rng = np.random.RandomState(0)
    official = tmp_path / "official"
    official.mkdir()
    wnid_folders = tmp_path / "ia"
    (wnid_folders / "imagenet-a").mkdir(parents=True)
    for wnid in imagenet_a_wnids():  # the official archive: the wnid folders alone
        (wnid_folders / "imagenet-a" / wnid).symlink_to(fake / "imagenet-a" / wnid)
    blobs = {
        "imagenet-a.tar": _tar(wnid_folders / "imagenet-a", "imagenet-a"),
        "tiny-imagenet-200.zip": _zip(fake / "tiny-imagenet-200", "tiny-imagenet-200"),
        "SUN397.tar.gz": _tar(_official_sun(tmp_path / "sun", rng), "SUN397"),
    }
    for name in ("imagenet_a", "tinyimagenet", "sun397"):
        unit = dataset_unit(name)
        fakes = [prepare.Archive(a.url, hashlib.md5(blobs[a.filename]).hexdigest()) for a in unit.archives()]
        monkeypatch.setattr(unit, "archives", lambda fakes=fakes: fakes)
    for filename, blob in blobs.items():
        (official / filename).write_bytes(blob)
    root = tmp_path / "data"
    argv = ["imagenet_a", "tinyimagenet", "sun397", "--data-root", str(root), "--mirror", str(official)]
    code, err, _ = _prepare(capsys, *argv, "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in root.iterdir()) == ["SUN397", "archives", "imagenet-a", "tiny-imagenet-200"]
    imagenet_a = load_dataset("imagenet_a", root, split="stratified")
    assert (imagenet_a.n_classes, len(imagenet_a.train), len(imagenet_a.test)) == (200, 200, 200)
    with pytest.raises(prepare.UserError, match="only from its authors' archive"):
        load_dataset("imagenet_a", root)  # the APER split is not in the official archive
    tiny = load_dataset("tinyimagenet", root)
    assert (tiny.n_classes, len(tiny.train), len(tiny.test)) == (200, 200, 200)
    sun = load_dataset("sun397", root, split="stratified")
    assert sun.class_names == ["abbey", "apartment building outdoor", "bakery shop"]
    assert (len(sun.train), len(sun.test)) == (12, 3) and sorted(set(sun.test_targets)) == [0, 1, 2]
    with pytest.raises(prepare.UserError, match="only from the C3Box authors' archive"):
        load_dataset("sun397", root)


# --- (d) every strategy, end to end ---------------------------------------------------------------

#: what the tiny CLIP (4 visual blocks) needs of the strategies whose defaults name deeper blocks,
#: as the smoke-baselines suite sets it
TINY_CLIP_OPTIONS = """[strategy.dualprompt]
e_layers = [2, 3]
[strategy.coda_prompt]
prompt_layers = [0, 1, 2, 3]
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, tasks", [("objectnet", 2), ("imagenet_a", 2), ("tinyimagenet", 2), ("sun397", 2)]
)
def test_every_strategy_walks_the_dataset_end_to_end(fake, name, tasks, tmp_path):
    suite = write_suite(tmp_path / "ptm.toml", tiny_suite(available(), tasks=tasks) + TINY_CLIP_OPTIONS)
    argv = ["--suite", suite, "--datasets", name, "--fast-dev-run", "--data-root", str(fake)]
    assert run.main([*argv, "--results-dir", str(tmp_path / "runs"), "--quiet"]) == 0
    results = [r for _, r in iter_results(tmp_path / "runs")]
    assert sorted(r["strategy"] for r in results) == sorted(available()) and len(results) == 12
    for result in results:
        assert result["dataset"] == name and len(result["stages"]) == tasks
        assert result["config"]["fake_data"] is True
