"""Dataset loaders on tiny on-disk fixtures in torchvision's layouts, plus the transforms."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES
from PIL import Image
from torchvision import transforms as T

from benchmarks.core.errors import DataNotFoundError, UserError
from benchmarks.data.datasets import (
    clean_class_name,
    imagenet_wnid_names,
    load_dataset,
    load_zero_shot_target,
    stratified_split,
)
from benchmarks.data.image_lists import TransformedDataset
from benchmarks.data.transforms import CLIP_MEAN, CLIP_STD, crop_padding, eval_transform, train_transform
from benchmarks.data.unit import dataset_names
from benchmarks.data.units import imagenet as imagenet_unit

GOLDFISH, TENCH, SHARK = "n01443537", "n01440764", "n01484850"


def _save_image(path: Path, seed: int, mode: str = "RGB", suffix_format: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.RandomState(seed).randint(0, 256, (6, 5, 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path, format=suffix_format)


# --- CIFAR-100 ----------------------------------------------------------------------------------


def _write_cifar100(root: Path) -> dict[str, list[int]]:
    """Pickles shaped like the official python version: 100 fine names, a few images per class."""
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    names = [f"class_{i}" for i in range(100)]
    names[3] = "maple_tree"
    with open(base / "meta", "wb") as f:
        pickle.dump({"fine_label_names": names, "coarse_label_names": ["x"] * 20}, f)
    labels = {"train": [0, 3, 3, 7, 0, 99], "test": [3, 7, 99]}
    rng = np.random.RandomState(0)
    for split, fine in labels.items():
        entry = {
            "data": rng.randint(0, 256, (len(fine), 3072), dtype=np.uint8),
            "fine_labels": fine,
            "coarse_labels": [0] * len(fine),
            "filenames": [f"{i}.png" for i in range(len(fine))],
        }
        with open(base / split, "wb") as f:
            pickle.dump(entry, f)
    return labels


def test_cifar100_loader(tmp_path: Path) -> None:
    labels = _write_cifar100(tmp_path)
    data = load_dataset("cifar100", tmp_path, verify_checksum=False)
    assert data.name == "cifar100" and data.n_classes == 100
    assert data.class_names[3] == "maple tree" and data.class_names[0] == "class 0"
    assert data.train_targets == labels["train"] and data.test_targets == labels["test"]
    image, label = data.test[1]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (32, 32)
    assert label == 7


def test_cifar100_checksum_failure_is_a_user_error(tmp_path: Path) -> None:
    _write_cifar100(tmp_path)
    with pytest.raises(UserError, match="MD5"):
        load_dataset("cifar100", tmp_path)


# --- ImageNet-R ---------------------------------------------------------------------------------


def _write_imagenet_r(root: Path, per_class: dict[str, int]) -> None:
    for c, (wnid, n) in enumerate(per_class.items()):
        for i in range(n):
            _save_image(
                root / "imagenet-r" / wnid / f"art_{i}.png", seed=100 * c + i, mode="L" if i == 0 else "RGB"
            )


def test_imagenet_r_split_is_stratified_deterministic_and_disjoint(tmp_path: Path) -> None:
    _write_imagenet_r(tmp_path, {GOLDFISH: 5, TENCH: 5, "n99999999": 10})
    data = load_dataset("imagenet_r", tmp_path, split="stratified")
    # Folders sort as n01440764 (tench), n01443537 (goldfish), then the unknown wnid.
    assert data.class_names == ["tench", "goldfish", "n99999999"]
    assert np.bincount(data.train_targets).tolist() == [4, 4, 8]
    assert np.bincount(data.test_targets).tolist() == [1, 1, 2]
    train_paths = {p for p, _ in data.train.samples}
    test_paths = {p for p, _ in data.test.samples}
    assert not train_paths & test_paths and len(train_paths | test_paths) == 20
    for path, label in data.train.samples + data.test.samples:
        assert Path(path).parent.name == ["n01440764", GOLDFISH, "n99999999"][label]

    again = load_dataset("imagenet_r", tmp_path, split="stratified")
    assert again.train.samples == data.train.samples and again.test.samples == data.test.samples
    other = load_dataset("imagenet_r", tmp_path, split="stratified", split_seed=1)
    assert {p for p, _ in other.test.samples} != test_paths

    image, _ = data.train[0]
    assert isinstance(image, Image.Image) and image.mode == "RGB"


def test_stratified_split_keeps_a_test_image_for_tiny_classes() -> None:
    samples = [("a0", 0), ("a1", 0), ("b0", 1), ("c0", 2), ("c1", 2), ("c2", 2)]
    train, test = stratified_split(samples)
    assert sorted(label for _, label in test) == [0, 2]
    assert sorted(label for _, label in train) == [0, 1, 2, 2]


def test_imagenet_r_split_file_overrides_the_split(tmp_path: Path) -> None:
    _write_imagenet_r(tmp_path, {GOLDFISH: 3, TENCH: 2})
    split = {
        "train": [f"{GOLDFISH}/art_0.png", f"imagenet-r/{TENCH}/art_1.png"],
        "test": [f"{GOLDFISH}/art_2.png"],
    }
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps(split))
    data = load_dataset("imagenet_r", tmp_path, split_file=split_file)
    assert [Path(p).relative_to(tmp_path / "imagenet-r").as_posix() for p, _ in data.train.samples] == [
        f"{GOLDFISH}/art_0.png",
        f"{TENCH}/art_1.png",
    ]
    assert data.train_targets == [1, 0] and data.test_targets == [1]

    split["test"].append(f"{GOLDFISH}/missing.png")
    split_file.write_text(json.dumps(split))
    with pytest.raises(DataNotFoundError, match="missing.png"):
        load_dataset("imagenet_r", tmp_path, split_file=split_file)

    split["test"] = [f"{GOLDFISH}/art_0.png"]
    split_file.write_text(json.dumps(split))
    with pytest.raises(UserError, match="both train and test"):
        load_dataset("imagenet_r", tmp_path, split_file=split_file)

    with pytest.raises(DataNotFoundError, match="nope.json"):
        load_dataset("imagenet_r", tmp_path, split_file=tmp_path / "nope.json")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"train\n\xe9t\xe9.jpg\ntest\n", "is not UTF-8 text"),
        (b"5", "must be JSON"),
        (b'{"train": [], "test": []}', "lists no train images"),
        (b"train\ntest\n", "lists no train images"),
        (b'{"train": [1, 2], "test": [3]}', "none of its entries is an image path"),
        (b'{"train": ["%s/art_0.png"], "test": []}' % GOLDFISH.encode(), "lists no test images"),
    ],
    ids=["latin-1", "a-number", "empty-json", "empty-text", "numbers", "no-test"],
)
def test_a_bad_imagenet_r_split_file_is_refused_in_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    _write_imagenet_r(tmp_path, {GOLDFISH: 3, TENCH: 2})
    split_file = tmp_path / "split.txt"
    split_file.write_bytes(content)
    with pytest.raises(UserError, match=message) as refused:
        load_dataset("imagenet_r", tmp_path, split_file=split_file)
    assert str(split_file) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"split_file": 5}, "split_file must be the path of a split list, not 5"),
        ({"split_file": True}, "split_file must be the path of a split list, not True"),
        ({"split": "stratified", "split_seed": "0"}, "split_seed must be an integer"),
        ({"split": "stratified", "split_seed": -5}, "split_seed must be between 0 and"),
        ({"split": "stratified", "train_fraction": "0.8"}, "train_fraction must be a number"),
    ],
)
def test_an_imagenet_r_option_of_the_wrong_type_is_one_line(
    tmp_path: Path, options: dict, message: str
) -> None:
    _write_imagenet_r(tmp_path, {GOLDFISH: 3, TENCH: 2})
    with pytest.raises(UserError, match=message):
        load_dataset("imagenet_r", tmp_path, **options)


# --- ImageNet-100 / ImageNet-1K -----------------------------------------------------------------


def _write_imagenet(root: Path, wnids: list[str], val_wnids: list[str] | None = None) -> None:
    for c, wnid in enumerate(wnids):
        for i in range(2):
            _save_image(
                root / "imagenet" / "train" / wnid / f"{wnid}_{i}.JPEG", seed=c * 10 + i, suffix_format="JPEG"
            )
    for c, wnid in enumerate(val_wnids if val_wnids is not None else wnids):
        _save_image(root / "imagenet" / "val" / wnid / f"val_{c}.JPEG", seed=500 + c, suffix_format="JPEG")


def test_imagenet100_takes_the_first_sorted_wnids(tmp_path: Path) -> None:
    _write_imagenet(tmp_path, [SHARK, GOLDFISH, TENCH])
    data = load_dataset("imagenet100", tmp_path, n_classes=2)
    assert data.class_names == ["tench", "goldfish"]
    assert data.train_targets == [0, 0, 1, 1] and data.test_targets == [0, 1]
    assert all(Path(p).parts[-3] == "val" for p, _ in data.test.samples)
    image, label = data.test[1]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and label == 1

    with pytest.raises(DataNotFoundError, match="needs the 100 ImageNet wnid folders .* 97 are missing"):
        load_dataset("imagenet100", tmp_path)
    # the first sorted wnids of ImageNet-1K, not of whatever folders a partial copy holds
    with pytest.raises(DataNotFoundError, match=f"1 are missing, e.g. .*{TENCH}"):
        other = tmp_path / "other"
        _write_imagenet(other, [GOLDFISH, SHARK])
        load_dataset("imagenet100", other, n_classes=2)


def _write_full_imagenet(root: Path, skip_train: str | None = None) -> list[str]:
    """Every ImageNet-1K wnid folder with one 1-pixel image in train and in val (2000 files)."""
    wnids = sorted(imagenet_wnid_names())
    for split in ("train", "val"):
        for wnid in wnids:
            if split == "train" and wnid == skip_train:
                continue
            folder = root / "imagenet" / split / wnid
            folder.mkdir(parents=True)
            Image.new("RGB", (1, 1)).save(folder / f"{wnid}.JPEG")
    return wnids


def test_imagenet1k_needs_all_1000_wnids_and_sorted_val(tmp_path: Path) -> None:
    _write_imagenet(tmp_path, [SHARK, GOLDFISH, TENCH])
    with pytest.raises(DataNotFoundError, match="needs the 1000 ImageNet wnid folders .* 997 are missing"):
        load_dataset("imagenet1k", tmp_path)  # a partial copy never passes for ImageNet-1K

    full = tmp_path / "full"
    wnids = _write_full_imagenet(full, skip_train=SHARK)
    with pytest.raises(DataNotFoundError, match=str(full / "imagenet" / "train" / SHARK)):
        load_dataset("imagenet1k", full)
    (full / "imagenet" / "train" / SHARK).mkdir()
    Image.new("RGB", (1, 1)).save(full / "imagenet" / "train" / SHARK / "x.JPEG")
    data = load_dataset("imagenet1k", full)
    assert data.n_classes == 1000 and data.class_names[:2] == ["tench", "goldfish"]
    assert data.train_targets == data.test_targets == list(range(1000))
    assert Path(data.train.samples[0][0]).parent.name == wnids[0]

    flat = tmp_path / "flat"  # raw ILSVRC val: one flat folder, not sorted into wnids
    _write_imagenet(flat, [GOLDFISH, TENCH], val_wnids=[TENCH])
    with pytest.raises(
        DataNotFoundError, match=str(flat / "imagenet" / "val" / "n0") + ".*sort the val images"
    ):
        load_dataset("imagenet1k", flat)


def test_zero_shot_targets_read_only_their_test_split(tmp_path: Path, monkeypatch) -> None:
    _write_full_imagenet(tmp_path)
    scanned = []
    real_scan = imagenet_unit.scan_folder
    monkeypatch.setattr(
        imagenet_unit, "scan_folder", lambda d, *a: scanned.append(Path(d).name) or real_scan(d, *a)
    )
    data = load_zero_shot_target("imagenet1k", tmp_path)
    assert scanned == ["val"] and data.train is None and data.n_classes == 1000
    shutil.rmtree(tmp_path / "imagenet" / "train")  # a val-only copy is enough for a zero-shot target
    assert load_zero_shot_target("imagenet1k", tmp_path).test_targets == list(range(1000))


def test_wnid_map_pairs_sorted_wnids_with_open_clip_names() -> None:
    names = imagenet_wnid_names()
    wnids = list(names)
    assert len(wnids) == len(set(wnids)) == 1000 and wnids == sorted(wnids)
    assert wnids[0] == TENCH and names[TENCH] == "tench"
    assert (
        names["n01443537"] == "goldfish" and names[wnids[-1]] == "toilet paper"
    )  # open_clip's names, by wnid
    assert list(names.values()) == list(IMAGENET_CLASSNAMES)


# --- zero-shot targets --------------------------------------------------------------------------


def test_pets_loader(tmp_path: Path) -> None:
    base = tmp_path / "oxford-iiit-pet"
    rows = {"test": ["Abyssinian_1 1 1 1", "american_bulldog_10 2 2 1", "Abyssinian_7 1 1 1"],
            "trainval": ["american_bulldog_3 2 2 1"]}  # fmt: skip
    (base / "annotations").mkdir(parents=True)
    for split, lines in rows.items():
        (base / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
        for i, line in enumerate(lines):
            _save_image(base / "images" / f"{line.split()[0]}.jpg", seed=i, suffix_format="JPEG")

    data = load_dataset("pets", tmp_path)
    assert data.class_names == ["Abyssinian", "American Bulldog"]
    assert data.train is None and data.train_targets is None
    assert data.test_targets == [0, 1, 0]
    image, label = data.test[1]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and label == 1

    with_train = load_dataset("pets", tmp_path, include_train=True)
    assert with_train.train_targets == [1]


def test_food101_loader(tmp_path: Path) -> None:
    base = tmp_path / "food-101"
    meta = {"apple_pie": ["apple_pie/11", "apple_pie/12"], "baby_back_ribs": ["baby_back_ribs/5"]}
    (base / "meta").mkdir(parents=True)
    (base / "meta" / "classes.txt").write_text("apple_pie\nbaby_back_ribs\n")
    (base / "meta" / "test.json").write_text(json.dumps(meta))
    for i, rel in enumerate(p for paths in meta.values() for p in paths):
        _save_image(base / "images" / f"{rel}.jpg", seed=i, suffix_format="JPEG")

    data = load_dataset("food101", tmp_path)
    assert data.class_names == ["apple pie", "baby back ribs"]
    assert data.train is None and data.test_targets == [0, 0, 1]
    image, label = data.test[2]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and label == 1


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(set(dataset_names()) - {"synthetic"}))
def test_missing_data_root_names_the_path(tmp_path: Path, name: str) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    with pytest.raises(DataNotFoundError) as error:
        load_dataset(name, root)
    message = str(error.value)
    assert str(root) in message and "--data-root" in message and "\n" not in message
    assert "download" not in message.lower()


def test_no_data_root_unknown_dataset_and_bad_option() -> None:
    with pytest.raises(UserError, match="--data-root"):
        load_dataset("cifar100", None)
    with pytest.raises(UserError, match="valid: cifar100, imagenet_r"):
        load_dataset("cifar10", "/tmp")
    with pytest.raises(UserError, match="split_seed"):
        load_dataset("imagenet_r", "/tmp", seed=3)
    with pytest.raises(UserError, match="split='rapf2' is not one of rapf, stratified"):
        load_dataset("imagenet_r", "/tmp", split="rapf2")


def test_clean_class_name() -> None:
    assert clean_class_name(" aquarium_fish ") == "aquarium fish"


# --- transforms ---------------------------------------------------------------------------------


def test_eval_transform_resizes_crops_and_normalises() -> None:
    image = Image.new("L", (40, 24), color=255)
    out = eval_transform(16)(image)
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32
    expected = (1.0 - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD)
    assert torch.allclose(out.mean((1, 2)), expected, atol=1e-4)


def test_train_transform_is_random_but_shaped() -> None:
    image = Image.fromarray(np.random.RandomState(0).randint(0, 256, (32, 32, 3), dtype=np.uint8))
    torch.manual_seed(0)
    first, second = train_transform(24)(image), train_transform(24)(image)
    assert first.shape == second.shape == (3, 24, 24)
    assert not torch.equal(first, second)


def test_train_augmentation_none_is_the_eval_transform() -> None:
    image = Image.fromarray(np.random.RandomState(1).randint(0, 256, (32, 32, 3), dtype=np.uint8))
    plain = train_transform(32, augmentation="none")
    assert torch.equal(plain(image), eval_transform(32)(image)) and torch.equal(plain(image), plain(image))
    with pytest.raises(ValueError, match="augmentation"):
        train_transform(32, augmentation="heavy")


def test_paper_scaled_augmentation_scales_the_crop_padding_to_the_image() -> None:
    """4 px of a 224 px image: 1 px at 32 px, 4 px at 224 px (the paper's pipeline), never 0."""
    assert [crop_padding(size, "paper-scaled") for size in (16, 32, 112, 224, 448)] == [1, 1, 2, 4, 8]
    assert crop_padding(32, "paper") == 4

    def padding_of(transform) -> int:
        (crop,) = [t for t in transform.transforms if isinstance(t, T.RandomCrop)]
        return crop.padding

    assert padding_of(train_transform(32, augmentation="paper-scaled")) == 1
    scaled, paper = train_transform(224, augmentation="paper-scaled"), train_transform(224)
    assert [repr(t) for t in scaled.transforms[1:]] == [repr(t) for t in paper.transforms[1:]]


def test_rrc90_is_open_clips_random_resized_crop() -> None:
    (crop,) = [
        t for t in train_transform(32, augmentation="rrc90").transforms if isinstance(t, T.RandomResizedCrop)
    ]
    assert (
        crop.size == (32, 32)
        and crop.scale == (0.9, 1.0)
        and crop.interpolation == T.InterpolationMode.BICUBIC
    )
    image = Image.fromarray(np.random.RandomState(2).randint(0, 256, (40, 30, 3), dtype=np.uint8))
    assert train_transform(32, augmentation="rrc90")(image).shape == (3, 32, 32)


def test_rrc_flip_is_the_coda_prompt_codebases_crop_and_flip() -> None:
    steps = train_transform(32, augmentation="rrc_flip").transforms
    (crop,) = [t for t in steps if isinstance(t, T.RandomResizedCrop)]
    assert (
        crop.size == (32, 32)
        and crop.scale == (0.08, 1.0)
        and crop.interpolation == T.InterpolationMode.BILINEAR
    )
    assert any(isinstance(t, T.RandomHorizontalFlip) for t in steps)
    image = Image.fromarray(np.random.RandomState(3).randint(0, 256, (40, 30, 3), dtype=np.uint8))
    assert train_transform(32, augmentation="rrc_flip")(image).shape == (3, 32, 32)
    (wide,) = [
        t
        for t in train_transform(32, augmentation="rrc05_flip").transforms
        if isinstance(t, T.RandomResizedCrop)
    ]
    assert wide.scale == (0.05, 1.0) and wide.ratio == (3 / 4, 4 / 3)  # APER's RevisitingCIL option


def test_transformed_dataset_applies_the_transform_and_pickles() -> None:
    images = [Image.new("RGB", (40, 30), (255, 0, 0)), Image.new("L", (10, 10), 128)]
    dataset = TransformedDataset(list(zip(images, [3, 7])), eval_transform(16))
    again = pickle.loads(pickle.dumps(dataset))  # workers under spawn/forkserver receive it pickled
    for data in (dataset, again):
        image, label = data[1]
        assert image.shape == (3, 16, 16) and label == 7
        torch.testing.assert_close(
            image[:, 0, 0],
            (torch.full((3,), 128 / 255) - torch.tensor(CLIP_MEAN)) / torch.tensor(CLIP_STD),
            atol=1e-6,
            rtol=0,
        )
    assert len(again) == 2
