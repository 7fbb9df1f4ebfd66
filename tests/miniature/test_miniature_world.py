"""The offline synthetic world: class vocabulary, determinism, balance and learnability."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import Image

from benchmarks.core.errors import UserError
from benchmarks.data.datasets import load_dataset
from benchmarks.data.synthetic import domains
from benchmarks.data.synthetic import world as S
from benchmarks.data.units.synthetic import load_synthetic


@pytest.fixture(scope="module")
def small():
    return load_synthetic(n_train_per_class=30, n_test_per_class=20, seed=0)


def test_vocabulary_has_at_least_100_unique_readable_classes() -> None:
    assert S.N_CLASSES >= 100
    names = [S.class_name(c) for c in range(S.N_CLASSES)]
    assert len(set(names)) == S.N_CLASSES
    assert S.class_name(S.encode_class(0, 1, 2)) == "red striped triangle"
    assert all(S.encode_class(*S.decode_class(c)) == c for c in range(S.N_CLASSES))


def test_default_subset_covers_every_attribute_value() -> None:
    ids = S.default_class_ids()
    assert len(ids) == len(set(ids)) == 100
    colours, patterns, shapes = zip(*(S.decode_class(c) for c in ids), strict=True)
    assert set(colours) == set(range(len(S.COLOUR_NAMES)))
    assert set(patterns) == set(range(len(S.PATTERN_NAMES)))
    assert set(shapes) == set(range(len(S.SHAPE_NAMES)))
    assert S.default_class_ids(20) == ids[:20]


def test_shapes_dtypes_and_balance(small) -> None:
    assert small.name == "synthetic" and small.n_classes == 100
    assert small.train.images.shape == (3000, 32, 32, 3) and small.train.images.dtype == np.uint8
    assert small.test.images.shape == (2000, 32, 32, 3)
    assert np.bincount(small.train_targets).tolist() == [30] * 100
    assert np.bincount(small.test_targets).tolist() == [20] * 100
    image, label = small.train[5]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (32, 32)
    assert label == small.train_targets[5] and isinstance(label, int)


def test_same_seed_same_bytes_other_seed_other_images(small) -> None:
    again = load_synthetic(n_train_per_class=30, n_test_per_class=20, seed=0)
    assert again.train.images.tobytes() == small.train.images.tobytes()
    assert again.test.images.tobytes() == small.test.images.tobytes()
    other = load_synthetic(n_train_per_class=30, n_test_per_class=20, seed=1)
    assert not np.array_equal(other.train.images, small.train.images)
    # Train and test come from different derived streams.
    assert not np.array_equal(small.train.images[:2000], small.test.images)


def test_render_is_per_image(small) -> None:
    rows = np.array([3, 1500, 2999])
    alone = S.render(small.train.attributes.subset(rows))
    assert np.array_equal(alone, small.train.images[rows])


def test_nuisances_vary_and_white_avoids_light_backgrounds() -> None:
    rng = np.random.default_rng(0)
    white = S.encode_class(S.COLOUR_NAMES.index("white"), 0, 0)
    attrs = S.sample_attributes([white] * 500 + [0] * 500, rng)
    assert not np.any(attrs.background[:500] == S.BACKGROUND_NAMES.index("light"))
    for field in (
        attrs.size,
        attrs.dx,
        attrs.dy,
        attrs.background[500:],
        attrs.distractor,
        attrs.distractor_colour,
        attrs.distractor_shape,
        attrs.distractor_corner,
    ):
        assert len(np.unique(field)) > 1
    assert 0.5 < attrs.distractor.mean() < 0.7  # P_DISTRACTOR = 0.6


def test_a_distractor_changes_only_its_own_corner() -> None:
    attrs = S.sample_attributes([0] * 200, np.random.default_rng(3))
    rows = np.flatnonzero(attrs.distractor)[:20]
    shown = attrs.subset(rows)
    hidden = dataclasses.replace(shown, distractor=np.zeros(len(rows), dtype=bool))
    diff = np.any(S.render(shown) != S.render(hidden), axis=-1)
    for image, corner in zip(diff, shown.distractor_corner, strict=True):
        ys, xs = np.nonzero(image)
        assert len(ys) > 10  # something was painted
        top, left = corner < 2, corner % 2 == 0
        half = S.IMAGE_SIZE // 2
        assert (ys < half).all() if top else (ys >= half).all()
        assert (xs < half).all() if left else (xs >= half).all()


def test_default_size_is_100_train_and_20_test_images_per_class() -> None:
    data = load_synthetic()
    assert len(data.train) + len(data.test) == 12000


def test_classes_are_learnable(small) -> None:
    """A closed-form ridge classifier on shift-invariant |FFT| features beats chance by far."""

    def features(images: np.ndarray) -> np.ndarray:
        spectrum = np.abs(np.fft.rfft2(images.astype(np.float32) / 255.0, axes=(1, 2)))
        return np.log1p(spectrum.reshape(len(images), -1))

    x_train, x_test = features(small.train.images), features(small.test.images)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    one_hot = np.eye(100)[small.train_targets]
    weights = np.linalg.solve(x_train.T @ x_train + 1000.0 * np.eye(x_train.shape[1]), x_train.T @ one_hot)
    accuracy = np.mean((x_test @ weights).argmax(1) == np.array(small.test_targets))
    assert accuracy > 0.25  # chance is 0.01

    # Even nearest class mean on raw pixels is above 5x chance.
    raw_train = small.train.images.reshape(3000, -1).astype(np.float32)
    raw_test = small.test.images.reshape(2000, -1).astype(np.float32)
    labels = np.array(small.train_targets)
    means = np.stack([raw_train[labels == c].mean(0) for c in range(100)])
    distances = (raw_test**2).sum(1)[:, None] - 2 * raw_test @ means.T + (means**2).sum(1)[None, :]
    assert np.mean(distances.argmin(1) == np.array(small.test_targets)) > 0.05


def test_registry_entry_needs_no_data_root() -> None:
    data = load_dataset("synthetic", n_train_per_class=2, n_test_per_class=1, n_classes=10, seed=3)
    assert data.n_classes == 10 and len(data.train) == 20 and len(data.test) == 10
    assert data.class_names == [S.class_name(c) for c in S.default_class_ids(10)]


def test_faded_keeps_a_fixed_fraction_of_the_contrast_by_hand() -> None:
    pixels = np.array([[[[0, 128, 255], [228, 28, 100]]]], dtype=np.uint8)
    faded = domains.faded(pixels, contrast=0.4)
    # 128 + 0.4 * (x - 128), rounded: 0 -> 76.8, 255 -> 178.8, 228 -> 168, 28 -> 88, 100 -> 116.8
    assert faded.tolist() == [[[[77, 128, 179], [168, 88, 117]]]]
    assert faded.dtype == np.uint8
    assert domains.apply_domain(pixels, "photo") is pixels


def test_domains_show_the_same_objects_and_stay_pure_functions_of_the_seed() -> None:
    photo = load_synthetic(n_train_per_class=3, n_test_per_class=2, seed=4)
    faded = load_synthetic(n_train_per_class=3, n_test_per_class=2, seed=4, domain="faded")
    again = load_synthetic(n_train_per_class=3, n_test_per_class=2, seed=4, domain="faded")
    assert faded.train.images.tobytes() == again.train.images.tobytes()
    for split in ("train", "test"):  # same nuisance draws: the shift is applied to the photo render
        shown, clean = getattr(faded, split), getattr(photo, split)
        assert np.array_equal(shown.images, domains.faded(clean.images))
        assert shown.targets == clean.targets
    assert faded.train.images.std() < 0.5 * photo.train.images.std()  # visibly washed out


def test_unknown_domain_is_a_user_error_naming_the_valid_ones() -> None:
    with pytest.raises(UserError, match="photo, faded"):
        load_dataset("synthetic", n_train_per_class=1, n_test_per_class=1, domain="sketch")
