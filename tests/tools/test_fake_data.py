"""``python -m benchmarks.tools.fake_data``: every real dataset in the layout its loader reads, with
the real class lists, marked as fake."""

import json

import pytest

from benchmarks.data.datasets import imagenet_wnid_names, load_dataset, load_zero_shot_target
from benchmarks.data.unit import dataset_unit
from benchmarks.data.units.cifar100 import CIFAR100_CLASSES
from benchmarks.data.units.food101 import FOOD101_CLASSES
from benchmarks.data.units.imagenet_r import imagenet_r_wnids
from benchmarks.data.units.pets import PETS_BREEDS
from benchmarks.tools import fake_data


@pytest.mark.slow
def test_every_loader_reads_the_fake_data_with_the_real_classes(tmp_path, capsys):
    assert fake_data.main(["--data-root", str(tmp_path), "--no-weights"]) == 0
    assert "--fast-dev-run --data-root" in capsys.readouterr().err
    record = json.loads((tmp_path / "FAKE_DATA.json").read_text())
    assert record["train_per_class"] == 2 and record["test_per_class"] == 1 and "weights" not in record
    cifar = load_dataset("cifar100", tmp_path)  # the MD5 check is skipped on a marked root
    assert (cifar.n_classes, len(cifar.train), len(cifar.test)) == (100, 200, 100)
    assert cifar.class_names[:2] == ["apple", "aquarium fish"] and cifar.test[0][0].size == (32, 32)
    imagenet_r = load_dataset("imagenet_r", tmp_path)  # 2 + 1 images a class, named as the RAPF list
    assert (imagenet_r.n_classes, len(imagenet_r.train), len(imagenet_r.test)) == (200, 400, 200)
    assert imagenet_r.class_names[0] == "goldfish"
    imagenet = load_dataset("imagenet1k", tmp_path)
    assert (imagenet.n_classes, len(imagenet.train), len(imagenet.test)) == (1000, 2000, 1000)
    assert load_dataset("imagenet100", tmp_path).n_classes == 100
    pets = load_zero_shot_target("pets", tmp_path)
    assert pets.n_classes == 37 and pets.class_names[1] == "American Bulldog" and len(pets.test) == 37
    food = load_zero_shot_target("food101", tmp_path)
    assert food.n_classes == 101 and food.class_names[0] == "apple pie" and len(food.test) == 101
    image, label = food.test[100]
    assert image.mode == "RGB" and label == 100


def test_class_lists_have_their_official_sizes():
    assert len(set(CIFAR100_CLASSES)) == 100 and CIFAR100_CLASSES == sorted(CIFAR100_CLASSES)
    assert len(set(FOOD101_CLASSES)) == 101
    assert len(set(PETS_BREEDS)) == 37
    imagenet_r = imagenet_r_wnids()
    assert len(set(imagenet_r)) == 200 and set(imagenet_r) <= set(imagenet_wnid_names())


def _snapshot(root) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder): what a refusal must not change."""
    return {
        path.relative_to(root).as_posix(): None if path.is_dir() else path.read_bytes()
        for path in sorted(root.rglob("*"))
    }


REAL_DATA = [*fake_data.dataset_folders().values(), "archives", ".prepare-pets"]


@pytest.mark.parametrize("asked", ["pets", "food101", "cifar100,imagenet_r"])
@pytest.mark.parametrize("real", REAL_DATA)
def test_it_refuses_a_root_with_any_real_dataset_and_changes_nothing(tmp_path, capsys, real, asked):
    # a real dataset's own file, e.g. Pets' annotations/test.txt, whatever the datasets asked for
    (tmp_path / real / "annotations").mkdir(parents=True)
    (tmp_path / real / "annotations" / "test.txt").write_text("Abyssinian_100 1 1 1\n")
    before = _snapshot(tmp_path)
    assert fake_data.main(["--data-root", str(tmp_path), "--datasets", asked, "--no-weights"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and f"holds real data ({real}/)" in err
    assert _snapshot(tmp_path) == before and not (tmp_path / "FAKE_DATA.json").exists()


def test_a_fake_root_grows_but_refuses_real_data_put_beside_it(tmp_path, capsys):
    assert fake_data.main(["--data-root", str(tmp_path), "--datasets", "cifar100", "--no-weights"]) == 0
    assert fake_data.main(["--data-root", str(tmp_path), "--datasets", "pets", "--no-weights"]) == 0
    record = json.loads((tmp_path / "FAKE_DATA.json").read_text())
    assert record["datasets"] == {"cifar100": "cifar-100-python", "pets": "oxford-iiit-pet"}
    assert load_zero_shot_target("pets", tmp_path).n_classes == 37
    assert load_dataset("cifar100", tmp_path).n_classes == 100  # the first call's data is still listed
    capsys.readouterr()

    (tmp_path / "food-101" / "meta").mkdir(parents=True)  # the real Food-101, copied in by hand
    (tmp_path / "food-101" / "meta" / "test.json").write_text('{"apple_pie": ["apple_pie/1"]}')
    before = _snapshot(tmp_path)
    assert fake_data.main(["--data-root", str(tmp_path), "--datasets", "food101", "--no-weights"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds real data (food-101/)" in err
    assert _snapshot(tmp_path) == before


def test_a_marker_it_did_not_write_makes_no_folder_its_own(tmp_path, capsys):
    (tmp_path / "oxford-iiit-pet").mkdir()
    (tmp_path / "FAKE_DATA.json").write_text('{"datasets": {"pets": "oxford-iiit-pet"}}')  # no generator
    assert fake_data.main(["--data-root", str(tmp_path), "--datasets", "pets", "--no-weights"]) == 2
    assert "holds real data (oxford-iiit-pet/)" in capsys.readouterr().err


def test_walk_never_makes_fake_data_beside_real_data(tmp_path, capsys):
    from benchmarks.tools import walk

    (tmp_path / "food-101").mkdir()
    before = _snapshot(tmp_path)
    assert walk.main(["--data-root", str(tmp_path), "--results-dir", str(tmp_path / "runs")]) == 2
    assert "holds real data (food-101/)" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_an_unwritable_root_is_one_line_and_a_killed_generation_is_completed_by_a_rerun(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "file").write_text("")
    assert fake_data.main(["--data-root", str(tmp_path / "file" / "data"), "--no-weights"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot write the fake data")

    def killed(*args):
        raise KeyboardInterrupt

    root = tmp_path / "data"
    monkeypatch.setattr(dataset_unit("pets"), "write_fake", killed)
    with pytest.raises(KeyboardInterrupt):
        fake_data.main(["--data-root", str(root), "--datasets", "cifar100,pets", "--no-weights"])
    monkeypatch.undo()
    assert fake_data.main(["--data-root", str(root), "--datasets", "cifar100,pets", "--no-weights"]) == 0
    assert (
        load_zero_shot_target("pets", root).n_classes == 37
        and load_dataset("cifar100", root).n_classes == 100
    )
