"""The fine-grained streams of the LAMDA family (cub200, cars196, aircraft, food100, ucf101), on their
fake layouts: splits that never share an image, the published class lists at known labels, the
published orders, ``prepare`` offline and with a damaged file (one line each), and a fast dev run of
every registered strategy on each."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import socket
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import run
from benchmarks.core.errors import DataNotFoundError
from benchmarks.data.class_orders import resolve_class_order
from benchmarks.data.datasets import load_dataset
from benchmarks.data.unit import Archive, dataset_unit, random_jpeg
from benchmarks.data.units import cars196 as cars_module
from benchmarks.data.units._authors_split import write_split_folders
from benchmarks.data.units._lamda import c3box_names
from benchmarks.data.units.cars196 import c3box_subset, stanford_cars_classes
from benchmarks.data.units.cub200 import cub_class_folders
from benchmarks.data.units.food101 import FOOD101_CLASSES
from benchmarks.prepare import command as prepare
from benchmarks.runner.reading import iter_results
from benchmarks.tools.fake_data import make_fake_data
from strategies.registry import available
from tests.helpers import tiny_suite, write_suite

UNITS = ("cub200", "cars196", "aircraft", "food100", "ucf101")


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    """Every unit's fake files, one training and one test image a class (all a fast dev run reads)."""
    root = tmp_path_factory.mktemp("fine-grained")
    make_fake_data(root, ("cub200", "cars196", "aircraft", "food101", "ucf101"), 1, 1, weights=False)
    return root


def _paths(split) -> list[str]:
    """The image paths of a split, whichever reader made it (ours, or torchvision's)."""
    if hasattr(split, "samples"):
        return [path for path, _ in split.samples]
    if hasattr(split, "_samples"):
        return [path for path, _ in split._samples]
    return [str(path) for path in split._image_files]


# --- (a) the splits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, options",
    [
        ("cub200", {}),
        ("cars196", {}),
        ("cars196", {"classes": "c3box"}),
        ("aircraft", {}),
        ("aircraft", {"train_split": "train"}),
        ("food100", {}),
        ("ucf101", {}),
    ],
)
def test_no_image_is_in_both_splits_and_every_class_is_in_each(fake, name, options):
    data = load_dataset(name, fake, **options)
    train, test = _paths(data.train), _paths(data.test)
    assert len(train) == len(set(train)) == len(data.train) and len(test) == len(set(test)) == len(data.test)
    assert not set(train) & set(test)
    assert set(data.train_targets) == set(data.test_targets) == set(range(data.n_classes))
    last = len(data.train) - 1
    assert data.train[last][1] == data.train_targets[last] and data.test[0][1] == data.test_targets[0]
    assert data.train[0][0].mode == "RGB"


@pytest.mark.parametrize(
    "name, names_key, n_classes, test_folder",
    [
        ("cub200", "cub200", 200, "test"),
        ("cars196", "cars", 100, "val"),
        ("aircraft", "aircraft", 100, "test"),
        ("food100", "food101", 100, "val"),
        ("ucf101", "ucf101", 100, "val"),
    ],
)
def test_the_lamda_folders_read_as_c3box_reads_them(tmp_path, name, names_key, n_classes, test_folder):
    unit = dataset_unit(name)
    folders = [f"{i:03d}.class" for i in range(n_classes)]
    write_split_folders(tmp_path / unit.folder, folders, 2, 1, np.random.RandomState(0), test_folder)
    data = load_dataset(name, tmp_path, layout="lamda")
    assert data.class_names == c3box_names(names_key)[:n_classes]
    assert (len(data.train), len(data.test)) == (2 * n_classes, n_classes)
    assert data.train_targets[:3] == [0, 0, 1] and not set(_paths(data.train)) & set(_paths(data.test))
    shutil.rmtree(tmp_path / unit.folder / test_folder / folders[-1])  # a partial copy is refused
    with pytest.raises(DataNotFoundError, match=f"holds {n_classes - 1} class folders"):
        load_dataset(name, tmp_path, layout="lamda")


def test_ucf101_midframes_are_split_by_the_official_lists(tmp_path):
    base = tmp_path / "ucf101"
    (base / "ucfTrainTestlist").mkdir(parents=True)
    actions = [name.replace(" ", "") for name in c3box_names("ucf101")] + ["YoYo"]
    actions[36] = "HandstandPushups"  # classInd.txt's name; its videos are v_HandStandPushups_*
    (base / "ucfTrainTestlist" / "classInd.txt").write_text(
        "".join(f"{i} {a}\r\n" for i, a in enumerate(actions, 1))
    )
    rng = np.random.RandomState(0)
    for name, group in (("trainlist01.txt", 8), ("testlist01.txt", 1)):
        lines = []
        for i, action in enumerate(actions, start=1):
            video = "HandStandPushups" if action == "HandstandPushups" else action
            folder = base / "UCF-101-midframes" / "_".join(re.findall("[A-Z][^A-Z]*", action))
            folder.mkdir(parents=True, exist_ok=True)
            random_jpeg(folder / f"v_{video}_g{group:02d}_c01.jpg", rng)
            lines.append(f"{action}/v_{video}_g{group:02d}_c01.avi" + (f" {i}" if group == 8 else ""))
        (base / "ucfTrainTestlist" / name).write_text("\r\n".join(lines) + "\r\n")
    data = load_dataset("ucf101", tmp_path, layout="midframes")
    assert data.n_classes == 100 and data.class_names == c3box_names("ucf101")
    assert (len(data.train), len(data.test)) == (100, 100) and not set(_paths(data.train)) & set(
        _paths(data.test)
    )
    assert data.train.samples[36] == (
        str(base / "UCF-101-midframes/Handstand_Pushups/v_HandStandPushups_g08_c01.jpg"),
        36,
    )
    assert set(data.test_targets) == set(range(100))  # YoYo, the 101st, is not streamed


# --- (b) the classes and their orders -------------------------------------------------------------


def test_cub200_classes_are_the_archives_with_c3box_names(fake):
    data = load_dataset("cub200", fake)
    folders = cub_class_folders()  # classes.txt: "22 022.Chuck_will_Widow", "141 141.Artic_Tern", ...
    assert (folders[21], folders[140], folders[199]) == (
        "022.Chuck_will_Widow",
        "141.Artic_Tern",
        "200.Common_Yellowthroat",
    )
    assert data.n_classes == 200 == dataset_unit("cub200").n_classes
    assert data.class_names[0] == "Black footed Albatross" and data.class_names[140] == "Artic Tern"
    assert data.class_names == [f[4:].replace("_", " ") for f in folders]


def test_cars196_numbers_classes_as_torchvision_and_c3box_as_its_sorted_folders(fake):
    data = load_dataset("cars196", fake)
    assert data.n_classes == 196 == dataset_unit("cars196").n_classes
    assert data.class_names == stanford_cars_classes()
    # cars_meta.mat's order: class 6 is the Integra, the last is the smart
    assert (
        data.class_names[0] == "AM General Hummer SUV 2000"
        and data.class_names[5] == "Acura Integra Type R 2001"
    )
    assert data.class_names[195] == "smart fortwo Convertible 2012"
    subset = load_dataset("cars196", fake, classes="c3box")
    assert subset.n_classes == 100 and subset.class_names == c3box_names("cars")[:100]
    assert subset.class_names[1] == "Acura Integra Type R 2001"
    # folder names sort "_" after letters: Audi_TTS_Coupe before Audi_TT_Hatchback, as C3Box lists them
    assert subset.class_names[21:23] == ["Audi TTS Coupe 2012", "Audi TT Hatchback 2011"]
    assert c3box_subset()[:2] == [0, 5] and len(set(c3box_subset())) == 100


def test_aircraft_food100_and_ucf101_names_are_c3box_lists(fake):
    aircraft = load_dataset("aircraft", fake)
    assert aircraft.n_classes == 100 and aircraft.class_names[0] == "707-320"
    assert aircraft.class_names[72:74] == ["F-16A/B", "F/A-18"] and aircraft.class_names[99] == "Yak-42"
    assert (fake / "aircraft" / "fgvc-aircraft-2013b" / "data" / "variants.txt").read_text().split("\n")[
        72
    ] == "F-16A/B"
    food = load_dataset("food100", fake)
    assert food.class_names == [c.replace("_", " ") for c in FOOD101_CLASSES[:100]]
    assert food.class_names[99] == "tuna tartare" and "waffles" not in food.class_names
    assert load_dataset("food101", fake, include_train=True).n_classes == 101  # the zero-shot unit: all 101
    ucf = load_dataset("ucf101", fake)
    assert ucf.n_classes == 100 and ucf.class_names[0] == "Apply Eye Makeup"
    assert ucf.class_names[36] == "Hand Stand Pushups" and ucf.class_names[99] == "Writing On Board"
    assert "Yo Yo" not in ucf.class_names


def test_published_splits_fit_the_class_counts_and_seed1993_is_proofs_order():
    expected = {
        "cub200": (200, {"proof": "B0-Inc20", "aper": "B0-Inc10"}),
        "cars196": (196, {}),
        "aircraft": (100, {"c3box": "B0-Inc10", "proof": "B0-Inc10"}),
        "food100": (100, {"proof": "B0-Inc10"}),
        "ucf101": (100, {"proof": "B0-Inc10"}),
    }
    for name, (n_classes, splits) in expected.items():
        unit = dataset_unit(name)
        assert (unit.n_classes, unit.published_splits) == (n_classes, splits)
        assert 8 <= unit.list_position <= 12
    # the orders zhoudw-zdw/PROOF@0bb2052 logged (logs/proof/cub/0/20/cubb0.log, aircraft/0/10/airb0.log)
    assert resolve_class_order("seed1993", 200, "cub200")[:6] == [168, 136, 51, 9, 183, 101]
    assert resolve_class_order("seed1993", 100, "aircraft")[:6] == [68, 56, 78, 8, 23, 84]


def test_image_counts_are_the_official_splits():
    assert dataset_unit("cub200").image_counts() == (5_994, 5_794)
    assert dataset_unit("cars196").image_counts() == (8_144, 8_041)
    assert dataset_unit("aircraft").image_counts() == (6_667, 3_333)
    assert dataset_unit("aircraft").image_counts(train_split="train") == (3_334, 3_333)
    assert dataset_unit("food100").image_counts() == (75_000, 25_000)
    assert dataset_unit("cub200").image_counts(layout="lamda") is None
    assert dataset_unit("ucf101").image_counts() is None


# --- (c) prepare ------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return closed.getsockname()[1]


def _prepare(capsys, *argv: str) -> tuple[int, str, float]:
    start = time.monotonic()
    code = prepare.main([*argv, "--quiet"])
    return code, capsys.readouterr().err, time.monotonic() - start


@pytest.mark.parametrize(
    "name, url", [("cub200", "CUB_200_2011.tgz"), ("aircraft", "fgvc-aircraft-2013b.tar.gz")]
)
def test_offline_prepare_names_the_url_in_one_line_and_a_bad_archive_is_refused(tmp_path, capsys, name, url):
    root = tmp_path / "data"
    mirror = f"http://127.0.0.1:{_closed_port()}"
    code, err, seconds = _prepare(capsys, name, "--data-root", str(root), "--mirror", mirror)
    assert code == 2 and err.count("\n") == 1 and seconds < 10
    assert dataset_unit(name).archives()[0].url in err and str(root / "archives" / url) in err
    (root / "archives" / url).write_bytes(b"not the archive")  # put there by hand, damaged
    code, err, _ = _prepare(capsys, name, "--data-root", str(root), "--mirror", mirror)
    assert code == 2 and err.count("\n") == 1 and "fails its MD5 check" in err
    assert (root / "archives" / url).read_bytes() == b"not the archive"  # the user's file is left
    assert sorted(p.name for p in root.iterdir()) == ["archives"] and sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["data"]


def _tar(folder: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(folder, arcname=arcname)
    return buffer.getvalue()


def test_cub200_and_aircraft_prepare_from_a_mirror_folder_and_load(tmp_path, capsys, monkeypatch):
    rng, made, mirror = np.random.RandomState(0), tmp_path / "made", tmp_path / "mirror"
    mirror.mkdir()
    blobs = {
        "CUB_200_2011.tgz": _tar(
            dataset_unit("cub200").write_fake(made, 1, 1, rng) / "CUB_200_2011", "CUB_200_2011"
        ),
        "fgvc-aircraft-2013b.tar.gz": _tar(
            dataset_unit("aircraft").write_fake(made, 1, 1, rng) / "fgvc-aircraft-2013b",
            "fgvc-aircraft-2013b",
        ),
    }
    for name in ("cub200", "aircraft"):
        unit = dataset_unit(name)
        (archive,) = unit.archives()
        (mirror / archive.filename).write_bytes(blobs[archive.filename])
        fake_sum = hashlib.md5(blobs[archive.filename]).hexdigest()
        monkeypatch.setattr(unit, "archives", lambda a=archive, s=fake_sum: [Archive(a.url, s)])
    root = tmp_path / "data"
    code, err, _ = _prepare(capsys, "cub200", "aircraft", "--data-root", str(root), "--mirror", str(mirror))
    assert code == 0, err
    assert load_dataset("cub200", root).n_classes == 200 and len(load_dataset("aircraft", root).test) == 100
    assert prepare.main(["--list", "--data-root", str(root)]) == 0
    rows = capsys.readouterr().out
    assert (
        "| cub200 | present |" in rows and "| aircraft | present |" in rows and "| ucf101 | missing |" in rows
    )


def test_cars196_prepares_only_from_the_users_files_checked_by_md5(tmp_path, capsys, monkeypatch):
    root, archives = tmp_path / "data", tmp_path / "mine"
    code, err, seconds = _prepare(capsys, "cars196", "--data-root", str(root), "--archives", str(archives))
    assert code == 2 and err.count("\n") == 1 and seconds < 10
    assert (
        "no official host serves" in err and str(archives / "cars_train.tgz") in err and "--archives" in err
    )
    made = (
        dataset_unit("cars196").write_fake(tmp_path / "made", 1, 1, np.random.RandomState(0))
        / "stanford_cars"
    )
    archives.mkdir()
    blobs = {
        "car_devkit.tgz": _tar(made / "devkit", "devkit"),
        "cars_train.tgz": _tar(made / "cars_train", "cars_train"),
        "cars_test.tgz": _tar(made / "cars_test", "cars_test"),
        "cars_test_annos_withlabels.mat": (made / "cars_test_annos_withlabels.mat").read_bytes(),
    }
    for filename, blob in blobs.items():
        (archives / filename).write_bytes(blob)
    # the official sums: the fakes fail them, and are left where they are
    code, err, _ = _prepare(capsys, "cars196", "--data-root", str(root), "--archives", str(archives))
    assert code == 2 and err.count("\n") == 1 and "fails its MD5 check" in err
    assert sorted(p.name for p in archives.iterdir()) == sorted(blobs) and not (root / "cars196").exists()
    fakes = [Archive(a.url, hashlib.md5(blobs[a.filename]).hexdigest()) for a in cars_module.CARS_FILES]
    monkeypatch.setattr(cars_module, "CARS_FILES", fakes)
    code, err, _ = _prepare(capsys, "cars196", "--data-root", str(root), "--archives", str(archives))
    assert code == 0, err
    data = load_dataset("cars196", root)
    assert data.n_classes == 196 and len(data.train) == 196 and not list(root.glob(".prepare-*"))


def test_ucf101_says_in_one_line_where_its_frames_come_from(tmp_path, capsys):
    code, err, seconds = _prepare(capsys, "ucf101", "--data-root", str(tmp_path / "data"))
    assert code == 2 and err.count("\n") == 1 and seconds < 10
    assert "no official download" in err and "C3Box" in err and str(tmp_path / "data" / "ucf101") in err
    assert not (tmp_path / "data" / "ucf101").exists()


def test_prepare_list_shows_the_fake_units_present(fake, capsys):
    assert prepare.main(["--list", "--data-root", str(fake)]) == 0
    out = capsys.readouterr().out
    for target in ("cub200", "cars196", "aircraft", "food101", "ucf101"):
        assert f"| {target} | present |" in out
    assert json.loads((fake / "FAKE_DATA.json").read_text())["datasets"]["ucf101"] == "ucf101"


# --- (d) every strategy on each unit -----------------------------------------------------------------

# The tiny CLIP has 4 visual blocks: prompt layers that fit it (as test_avalanche_conformance.py sets).
TINY_OPTIONS = """
[defaults]
lora_rank = 2
eval_batch_size = 256
[strategy.dualprompt]
e_layers = [2, 3]
[strategy.coda_prompt]
prompt_layers = [0, 1, 2, 3]
components = 12
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", UNITS)
def test_every_strategy_walks_the_unit_in_a_fast_dev_run(fake, tmp_path, name):
    strategies = available()
    assert len(strategies) == 12
    # cars196 walks its published stream, the 100 classes of classes="c3box": its 196 took 71 s (cub200's
    # 200: 55 s; the 100-class units: 31-36 s on 2 busy cores); its 196 are loaded and checked above
    options = '[dataset.cars196]\nclasses = "c3box"\n' if name == "cars196" else ""
    suite = write_suite(tmp_path / "tiny.toml", tiny_suite(strategies, tasks=2) + TINY_OPTIONS + options)
    argv = ["--suite", suite, "--datasets", name, "--fast-dev-run", "--data-root", str(fake)]
    assert run.main([*argv, "--results-dir", str(tmp_path / "runs"), "--quiet"]) == 0
    results = [r for _, r in iter_results(tmp_path / "runs")]
    assert sorted(r["strategy"] for r in results) == sorted(strategies)
    for result in results:
        assert (
            result["dataset"] == name and len(result["stages"]) == 2 and result["config"]["fake_data"] is True
        )
