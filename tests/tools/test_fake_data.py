"""``python -m benchmarks.tools.fake_data``: every real dataset in the layout its loader reads, with
the real class lists, marked as fake."""

import json

import pytest

from benchmarks.data.datasets import load_dataset, load_zero_shot_target
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
    assert len(set(fake_data.CIFAR100_CLASSES)) == 100 and fake_data.CIFAR100_CLASSES == sorted(
        fake_data.CIFAR100_CLASSES
    )
    assert len(set(fake_data.FOOD101_CLASSES)) == 101
    assert len(set(fake_data.PETS_BREEDS)) == 37
    imagenet_r = fake_data._wnids("imagenet_r_wnids.json")
    assert len(set(imagenet_r)) == 200 and set(imagenet_r) <= set(fake_data._wnids("imagenet_wnids.json"))


def test_it_never_writes_into_a_real_data_folder(tmp_path, capsys):
    (tmp_path / "cifar-100-python").mkdir()
    assert fake_data.main(["--data-root", str(tmp_path), "--datasets", "pets", "--no-weights"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a fake-data folder" in err
    assert not (tmp_path / "oxford-iiit-pet").exists()


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
    monkeypatch.setattr(fake_data, "write_pets", killed)
    with pytest.raises(KeyboardInterrupt):
        fake_data.main(["--data-root", str(root), "--datasets", "cifar100,pets", "--no-weights"])
    monkeypatch.undo()
    assert fake_data.main(["--data-root", str(root), "--datasets", "cifar100,pets", "--no-weights"]) == 0
    assert (
        load_zero_shot_target("pets", root).n_classes == 37
        and load_dataset("cifar100", root).n_classes == 100
    )
