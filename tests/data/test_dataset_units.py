"""Dataset units: every dataset is one registered unit, and a unit dropped into the package (the
worked unit of docs/adding-a-dataset.md, written by this test into a folder on the package's search
path) is found by ``prepare --list``, ``fake_data`` and ``run`` with no edit elsewhere."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from analysis.paper_inputs import dataset_name
from benchmarks import run
from benchmarks.data import unit as unit_module
from benchmarks.data.datasets import load_dataset
from benchmarks.data.unit import dataset_names, dataset_unit, file_targets, target_of
from benchmarks.prepare import command as prepare
from benchmarks.runner.reading import iter_results
from benchmarks.tools import fake_data
from tests.helpers import tiny_suite, write_suite

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "adding-a-dataset.md"
UNITS = ROOT / "benchmarks" / "data" / "units"


def test_every_dataset_is_a_unit_and_imagenet_is_one_target_for_two_datasets():
    assert dataset_names() == [
        "cifar100",
        "imagenet_r",
        "imagenet100",
        "imagenet1k",
        "pets",
        "food101",
        "synthetic",
        "cub200",
        "cars196",
        "aircraft",
        "food100",
        "ucf101",
        "objectnet",
        "imagenet_a",
        "tinyimagenet",
        "sun397",
    ]
    assert list(file_targets()) == [
        "cifar100",
        "imagenet_r",
        "imagenet",
        "pets",
        "food101",
        "cub200",
        "cars196",
        "aircraft",
        "ucf101",
        "objectnet",
        "imagenet_a",
        "tinyimagenet",
        "sun397",
    ]
    assert target_of("imagenet100") == target_of("imagenet1k") == target_of("imagenet") == "imagenet"
    assert target_of("food100") == "food101"  # Food-101's 100 LAMDA classes, read from its files
    assert target_of("synthetic") is None and target_of("nothing") is None
    assert dataset_unit("imagenet100").folder == dataset_unit("imagenet1k").folder == "imagenet"


def test_prepare_and_fake_data_take_a_dataset_name_for_its_target(tmp_path, capsys):
    args = prepare.parse_args(["imagenet100", "imagenet1k", "cifar100"])
    assert args.targets == ["imagenet", "cifar100"]
    code = fake_data.main(["--data-root", str(tmp_path), "--datasets", "imagenet1k,nope", "--no-weights"])
    assert code == 2 and "unknown dataset 'nope'" in capsys.readouterr().err


def _guide_unit() -> str:
    (code,) = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return code


@pytest.fixture
def dropped_unit(monkeypatch, tmp_path):
    """The guide's unit as a new module of the units package, found by a fresh discovery (as in a
    new process); its module and its registration are gone afterwards. The file lies in a folder of
    this test's own, added to the package's ``__path__``: discovery lists, and the import system
    searches, every folder there, ``benchmarks/data/units/`` first. (A file in that folder itself
    would be found by every other test process discovering the units meanwhile: pytest-xdist.)"""
    package = importlib.import_module(unit_module.UNITS_PACKAGE)
    assert [Path(folder).resolve() for folder in package.__path__] == [UNITS]
    module = "flowers5_dropped"
    folder = tmp_path / "units"
    folder.mkdir()
    (folder / f"{module}.py").write_text(_guide_unit())
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no .pyc of it left behind
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    monkeypatch.setattr(unit_module.DATASETS, "members", dict(unit_module.DATASETS.members))
    monkeypatch.setattr(unit_module.DATASETS, "discovered", False)
    importlib.invalidate_caches()  # the import system caches the folders' listings
    try:
        yield "flowers5"
    finally:
        sys.modules.pop(f"{unit_module.UNITS_PACKAGE}.{module}", None)
        importlib.invalidate_caches()


def test_a_dropped_in_unit_is_prepared_faked_and_run(dropped_unit, tmp_path, capsys):
    name = dropped_unit
    data_root, fake = tmp_path / "data", tmp_path / "fake"

    assert prepare.main(["--list", "--data-root", str(data_root)]) == 0
    assert f"| {name} | missing | {data_root / name} |" in capsys.readouterr().out

    argv = ["--data-root", str(fake), "--datasets", name, "--no-weights", "--train-per-class", "2"]
    assert fake_data.main(argv) == 0
    capsys.readouterr()
    data = load_dataset(name, fake)
    assert data.class_names == ["daisy", "dandelion", "rose", "sunflower", "tulip"]
    assert (len(data.train), len(data.test)) == (10, 5)
    assert prepare.main(["--list", "--data-root", str(fake)]) == 0
    assert f"| {name} | present |" in capsys.readouterr().out

    suite = write_suite(tmp_path / "tiny.toml", tiny_suite(["continual_clip"], tasks=5))
    results = tmp_path / "runs"
    argv = ["--suite", suite, "--datasets", name, "--fast-dev-run", "--data-root", str(fake)]
    assert run.main([*argv, "--results-dir", str(results), "--quiet"]) == 0
    (result,) = [r for _, r in iter_results(results)]
    assert result["dataset"] == name and len(result["stages"]) == 5
    assert result["config"]["fake_data"] is True
    assert dataset_name(name) == "Flowers-5"
